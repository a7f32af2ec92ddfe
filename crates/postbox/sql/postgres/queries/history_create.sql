-- The migrations applied to an outbox, by name: a table of Postbox's own, never the
-- application's migration table.
CREATE TABLE IF NOT EXISTS {schema}.postbox_schema_history (
    name VARCHAR(255) PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
