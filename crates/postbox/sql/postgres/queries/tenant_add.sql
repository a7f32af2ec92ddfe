-- Registers tenant $1 in schema $2; no row when the id or the schema is taken.
INSERT INTO {schema}.postbox_tenants (id, schema_name) VALUES ($1, $2)
ON CONFLICT DO NOTHING
RETURNING id, schema_name, status, created_at
