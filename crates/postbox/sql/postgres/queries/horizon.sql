-- The table's commit horizon (functions/postbox_horizon.sql): $1, $2 the probe kept from the last
-- call (NULLs at first). Returns the probe to keep and, once its writers are gone, `settled`.
SELECT probe_last, probe_writers, settled
FROM {schema}.postbox_horizon($1::bigint, $2::text[])
