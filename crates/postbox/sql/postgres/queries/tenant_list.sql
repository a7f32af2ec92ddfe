-- Every row of the tenant registry, by id: id, schema name, status, when added.
SELECT id, schema_name, status, created_at FROM {schema}.postbox_tenants ORDER BY id
