-- The last id the outbox table's AUTOINCREMENT counter handed out (no row before the first).
SELECT seq FROM sqlite_sequence WHERE name = 'outbox_events'
