-- Seconds until an outstanding event can be claimed (0: now), NULL when nothing is outstanding.
-- See functions/postbox_backlog.sql.
SELECT {schema}.postbox_backlog()
