-- A relay's (?1) earlier report of its sinks, and every report older than a day, removed.
DELETE FROM postbox_sink_health
WHERE relay_id = ?1 OR reported_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 day')
