-- Tenant ids and schema names as Postbox accepts them (lower-case ASCII letters, digits and `_`,
-- starting with a letter or `_`; a schema of at most 63 bytes and not PostgreSQL's own), so a
-- row added by hand cannot name what no relay would serve. NOT VALID: rows written before this
-- migration are not checked here; relays skip and report them instead.
ALTER TABLE {schema}.postbox_tenants
    ADD CONSTRAINT postbox_tenants_id_format
    CHECK (id ~ '^[a-z_][a-z0-9_]{0,60}$') NOT VALID;
ALTER TABLE {schema}.postbox_tenants
    ADD CONSTRAINT postbox_tenants_schema_format
    CHECK (schema_name ~ '^[a-z_][a-z0-9_]{0,62}$'
           AND schema_name NOT LIKE 'pg\_%'
           AND schema_name <> 'information_schema') NOT VALID;
