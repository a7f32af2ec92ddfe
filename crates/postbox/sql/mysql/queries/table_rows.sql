-- The table's row estimate from InnoDB's statistics: PROCESSED is estimated from it past the
-- exact limit of status_counts.sql.
SELECT CAST(TABLE_ROWS AS SIGNED) FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_events'
