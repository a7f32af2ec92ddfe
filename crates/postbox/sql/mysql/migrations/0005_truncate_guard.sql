-- A dedup id is never handed out twice (docs/guarantees.md): an event without an idempotency key
-- is deduplicated by its id, and `TRUNCATE TABLE outbox_events` restarts the AUTO_INCREMENT
-- counter at 1, so that new events would take the ids of events already relayed and consumers'
-- inboxes would drop them as repeats — a loss with no error. MySQL and MariaDB refuse to
-- truncate a table that another table's foreign key references: this table's does, so a
-- TRUNCATE fails with an error naming it. Empty the outbox with DELETE (which keeps the
-- counter), `postbox purge` or `postbox archive`. The table never holds a row: its foreign key
-- costs each deleted outbox row one look into an empty index.
CREATE TABLE IF NOT EXISTS postbox_truncate_guard (
    id BIGINT NOT NULL PRIMARY KEY,
    CONSTRAINT postbox_truncate_guard_fk FOREIGN KEY (id) REFERENCES outbox_events (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
