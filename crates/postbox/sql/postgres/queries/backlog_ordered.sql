-- Seconds until an outstanding event can be claimed (0: now), NULL when nothing is outstanding,
-- for a relay with ordered aggregate types ($1). See
-- functions/postbox_backlog.sql.
SELECT {schema}.postbox_backlog($1::text[])
