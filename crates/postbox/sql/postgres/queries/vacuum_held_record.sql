-- A relay vacuumed the outbox table of schema $1 while $2 held vacuum back (as
-- vacuum_horizon.sql gives it), or while nothing did ($2 NULL: the row goes).
WITH gone AS (
    DELETE FROM {schema}.postbox_vacuums v WHERE v.schema_name = $1 AND $2::text IS NULL
)
INSERT INTO {schema}.postbox_vacuums AS v (schema_name, held_by)
SELECT $1, $2::text WHERE $2::text IS NOT NULL
ON CONFLICT (schema_name) DO UPDATE SET held_by = excluded.held_by, vacuumed_at = now()
