-- Autovacuum's ANALYZE of the outbox table is turned off. An ANALYZE holds a snapshot while it
-- samples the table (seconds on a large one, slowed by autovacuum's cost limits), and a busy
-- outbox is analyzed often: every mark changes a row. While that snapshot is open no dead row
-- version of a marked event can be removed, by VACUUM or by the index scans of claims, so
-- claims walk ever more dead entries; drains measured several times slower with it on.
-- Nothing Postbox runs needs the column statistics: the claim's plan is pinned (postbox_claim),
-- marks go by id, and VACUUM keeps the row count the planner uses current. An operator can
-- still run ANALYZE by hand, or undo this with
--   ALTER TABLE outbox_events RESET (autovacuum_analyze_threshold);
ALTER TABLE {schema}.outbox_events SET (autovacuum_analyze_threshold = 2147483647);
