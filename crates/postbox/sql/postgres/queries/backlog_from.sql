-- Seconds until an outstanding event can be claimed (0: now), NULL when nothing is outstanding,
-- read from a relay's floor ($1) and the ranges of ids it passed ($2, $3: their first and last
-- ids). See functions/postbox_backlog.sql.
SELECT {schema}.postbox_backlog($1::bigint, $2::bigint[], $3::bigint[])
