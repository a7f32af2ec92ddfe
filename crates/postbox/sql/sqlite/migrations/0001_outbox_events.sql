-- The outbox table on SQLite, mirroring PostgreSQL's (docs/architecture.md, "The table"). Times are UTC text in one
-- fixed format (YYYY-MM-DDTHH:MM:SS.SSSZ), so they compare correctly as strings. A row inserted
-- by plain SQL with only event_type, aggregate_type, aggregate_id and payload is a valid PENDING
-- event.
CREATE TABLE outbox_events (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    status          TEXT    NOT NULL DEFAULT 'PENDING'
                    CHECK (status IN ('PENDING', 'PROCESSING', 'PROCESSED', 'FAILED')),
    event_type      TEXT    NOT NULL CHECK (length(event_type) <= 100),
    aggregate_type  TEXT    CHECK (length(aggregate_type) <= 100),
    aggregate_id    TEXT    CHECK (length(aggregate_id) <= 100),
    payload         TEXT    NOT NULL CHECK (json_valid(payload)),
    event_class     TEXT    CHECK (length(event_class) <= 255),
    schema_version  INTEGER NOT NULL DEFAULT 1,
    headers         TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(headers)),
    idempotency_key TEXT    CHECK (length(idempotency_key) <= 255),
    retry_count     INTEGER NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    max_retries     INTEGER NOT NULL DEFAULT 5 CHECK (max_retries >= 0), -- 5: postbox::DEFAULT_MAX_RETRIES
    last_error      TEXT,
    processed_at    TEXT,
    locked_until    TEXT,
    locked_by       TEXT,
    claim_token     TEXT,
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE INDEX outbox_events_due_idx
    ON outbox_events (id)
    WHERE status IN ('PENDING', 'PROCESSING');

CREATE UNIQUE INDEX outbox_events_idempotency_key_idx
    ON outbox_events (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE INDEX outbox_events_failed_idx
    ON outbox_events (id)
    WHERE status = 'FAILED';

CREATE TABLE outbox_events_archive (
    id              INTEGER PRIMARY KEY,
    status          TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    aggregate_type  TEXT,
    aggregate_id    TEXT,
    payload         TEXT    NOT NULL,
    event_class     TEXT,
    schema_version  INTEGER NOT NULL,
    headers         TEXT    NOT NULL,
    idempotency_key TEXT,
    retry_count     INTEGER NOT NULL,
    max_retries     INTEGER NOT NULL,
    last_error      TEXT,
    processed_at    TEXT,
    locked_until    TEXT,
    locked_by       TEXT,
    claim_token     TEXT,
    created_at      TEXT    NOT NULL,
    updated_at      TEXT    NOT NULL,
    archived_at     TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
