-- Per-aggregate ordering (G6, docs/guarantees.md); see the PostgreSQL migration
-- 0007_ordering.sql. SQLite commits one write transaction at a time and draws ids inside it, so
-- ids are in commit order: no commit horizon is needed.

-- An operator's skip of a FAILED head: it no longer holds back its aggregate. A retry clears it.
ALTER TABLE outbox_events ADD COLUMN skipped_at TEXT;

-- The unfinished events of each aggregate, in id order.
CREATE INDEX outbox_events_aggregate_idx
    ON outbox_events (aggregate_type, aggregate_id, id)
    WHERE status IN ('PENDING', 'PROCESSING', 'FAILED') AND skipped_at IS NULL
      AND aggregate_id IS NOT NULL;
