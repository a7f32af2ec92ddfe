-- Seconds until an outstanding event can be claimed (0: now), NULL when nothing is outstanding,
-- for a relay with ordered aggregate types ($1). See postbox_backlog(text[]) (migration
-- 0007_ordering.sql).
SELECT {schema}.postbox_backlog($1::text[])
