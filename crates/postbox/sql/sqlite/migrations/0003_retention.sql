-- Retention (docs/retention.md): purging finds archived events by archiving time.
CREATE INDEX outbox_events_archive_archived_at_idx ON outbox_events_archive (archived_at);
