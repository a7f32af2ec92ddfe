-- The tenants of the registry in {schema}, each with whether the relay serves it (ACTIVE),
-- whether its outbox table exists, and whether the publication $1 holds that table.
WITH published AS MATERIALIZED (
    SELECT p.schemaname
    FROM pg_catalog.pg_publication_tables p
    WHERE p.pubname = $1 AND p.tablename = 'outbox_events'
)
SELECT t.schema_name::text AS schema_name,
       t.status = 'ACTIVE' AS active,
       c.oid IS NOT NULL AS migrated,
       p.schemaname IS NOT NULL AS published
FROM {schema}.postbox_tenants t
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = t.schema_name
LEFT JOIN pg_catalog.pg_class c
       ON c.relnamespace = n.oid AND c.relname = 'outbox_events' AND c.relkind IN ('r', 'p')
LEFT JOIN published p ON p.schemaname = t.schema_name
