-- The migrations applied to an outbox, by name: a table of Postbox's own, never the
-- application's migration table.
CREATE TABLE IF NOT EXISTS postbox_schema_history (
    name VARCHAR(255) PRIMARY KEY,
    applied_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))
)
