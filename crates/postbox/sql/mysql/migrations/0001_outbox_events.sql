-- The outbox on MySQL 8.0+ and MariaDB 10.6+, mirroring PostgreSQL's (docs/architecture.md, "The table"). Times are UTC
-- DATETIME(6), written on the database clock (UTC_TIMESTAMP, whatever a session's time zone); a
-- row inserted by plain SQL with only event_type, aggregate_type, aggregate_id and payload is a
-- valid PENDING event. Text compares byte for byte (utf8mb4_bin): idempotency keys, aggregate
-- ids and event types are case-sensitive, as on PostgreSQL. JSON is kept as text (checked with
-- JSON_VALID) so that payloads are forwarded exactly as written.
--
-- MySQL has no partial indexes: due events are found through (status, id), a claim reading the
-- PENDING and the PROCESSING range each in id order; an aggregate's unfinished events through
-- (aggregate_type, aggregate_id, status, id).
CREATE TABLE outbox_events (
    id              BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    status          VARCHAR(16)  NOT NULL DEFAULT 'PENDING',
    event_type      VARCHAR(100) NOT NULL,
    aggregate_type  VARCHAR(100),
    aggregate_id    VARCHAR(100),
    payload         LONGTEXT     NOT NULL,
    event_class     VARCHAR(255),
    schema_version  INT          NOT NULL DEFAULT 1,
    headers         TEXT         NOT NULL DEFAULT ('{}'),
    idempotency_key VARCHAR(255),
    retry_count     INT          NOT NULL DEFAULT 0,
    max_retries     INT          NOT NULL DEFAULT 5, -- 5: postbox::DEFAULT_MAX_RETRIES
    last_error      TEXT,
    processed_at    DATETIME(6),
    locked_until    DATETIME(6),
    locked_by       VARCHAR(255),
    claim_token     CHAR(36),
    skipped_at      DATETIME(6),
    created_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    updated_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    CONSTRAINT outbox_events_status_check
        CHECK (status IN ('PENDING', 'PROCESSING', 'PROCESSED', 'FAILED')),
    CONSTRAINT outbox_events_payload_check CHECK (JSON_VALID(payload)),
    CONSTRAINT outbox_events_headers_check CHECK (JSON_VALID(headers)),
    CONSTRAINT outbox_events_retry_count_check CHECK (retry_count >= 0),
    CONSTRAINT outbox_events_max_retries_check CHECK (max_retries >= 0),
    UNIQUE KEY outbox_events_idempotency_key_idx (idempotency_key),
    KEY outbox_events_status_idx (status, id),
    KEY outbox_events_aggregate_idx (aggregate_type, aggregate_id, status, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE outbox_events_archive (
    id              BIGINT       NOT NULL PRIMARY KEY,
    status          VARCHAR(16)  NOT NULL,
    event_type      VARCHAR(100) NOT NULL,
    aggregate_type  VARCHAR(100),
    aggregate_id    VARCHAR(100),
    payload         LONGTEXT     NOT NULL,
    event_class     VARCHAR(255),
    schema_version  INT          NOT NULL,
    headers         TEXT         NOT NULL,
    idempotency_key VARCHAR(255),
    retry_count     INT          NOT NULL,
    max_retries     INT          NOT NULL,
    last_error      TEXT,
    processed_at    DATETIME(6),
    locked_until    DATETIME(6),
    locked_by       VARCHAR(255),
    claim_token     CHAR(36),
    skipped_at      DATETIME(6),
    created_at      DATETIME(6)  NOT NULL,
    updated_at      DATETIME(6)  NOT NULL,
    archived_at     DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY outbox_events_archive_archived_at_idx (archived_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- What each relay last saw of its sinks (see the PostgreSQL migration of the same name).
CREATE TABLE postbox_sink_health (
    relay_id    VARCHAR(255) NOT NULL,
    sink        VARCHAR(255) NOT NULL,
    up          BOOLEAN      NOT NULL,
    since       DATETIME(6)  NOT NULL,
    last_error  TEXT,
    reported_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (relay_id, sink)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
