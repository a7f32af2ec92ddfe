-- The schema of an outbox, if missing.
CREATE SCHEMA IF NOT EXISTS {schema}
