-- Up to ?2 archived events archived more than ?1 seconds ago are deleted (archived_at is always
-- written by Postbox, in one form, so the comparison can use its index).
DELETE FROM outbox_events_archive
WHERE id IN (
    SELECT id FROM outbox_events_archive
    WHERE archived_at < strftime('%Y-%m-%dT%H:%M:%fZ', julianday('now') - ?1 / 86400.0)
    ORDER BY archived_at
    LIMIT ?2
)
