-- The last id the table's AUTO_INCREMENT counter handed out (0 before the first), read from the
-- table's metadata without touching its rows. It moves when a row is inserted, before its
-- transaction commits, and also for one that rolls back.
SELECT CAST(AUTO_INCREMENT AS SIGNED) - 1 FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_events'
