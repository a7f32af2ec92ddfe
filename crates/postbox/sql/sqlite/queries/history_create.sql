-- The migrations applied to an outbox, by name: a table of Postbox's own, never the
-- application's migration table.
CREATE TABLE IF NOT EXISTS postbox_schema_history (
    name VARCHAR(255) PRIMARY KEY,
    applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
)
