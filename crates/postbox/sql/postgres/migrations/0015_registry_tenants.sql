-- The tenant registry, in the default schema only.
CREATE TABLE {schema}.postbox_tenants (
    id          TEXT        PRIMARY KEY,
    schema_name TEXT        NOT NULL UNIQUE,
    status      TEXT        NOT NULL DEFAULT 'ACTIVE' CHECK (status IN ('ACTIVE', 'SUSPENDED')),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
