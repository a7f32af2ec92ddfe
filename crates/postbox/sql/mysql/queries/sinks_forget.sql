-- A relay's (?) earlier report of its sinks, and every report older than a day, removed.
DELETE FROM postbox_sink_health
WHERE relay_id = ? OR reported_at < UTC_TIMESTAMP(6) - INTERVAL 1 DAY
