-- A dry run of archive_purge.sql: how many archived events were archived more than ?1 seconds ago.
SELECT count(*) FROM outbox_events_archive
WHERE archived_at < strftime('%Y-%m-%dT%H:%M:%fZ', julianday('now') - ?1 / 86400.0)
