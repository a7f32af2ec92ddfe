-- Seconds until an outstanding event can be claimed (0: now), NULL when nothing is outstanding.
-- See postbox_backlog (migration 0004_bounded_reads.sql).
SELECT {schema}.postbox_backlog()
