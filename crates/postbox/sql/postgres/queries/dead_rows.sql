-- Dead row versions in the outbox table of each of the schemas $1, as the statistics know them.
-- The schemas are joined, not matched with `= ANY($1)`: with thousands of tenants that compares
-- every outbox table with every name (10,000 schemas: 3 s a check), a hash join once each.
SELECT t.schemaname::text, t.n_dead_tup
FROM unnest($1::text[]) AS wanted(name)
JOIN pg_stat_user_tables t ON t.schemaname = wanted.name AND t.relname = 'outbox_events'
