-- What every relay last reported of its sinks: relay, sink, up, since, last error, and the
-- seconds since the report.
SELECT relay_id, sink, up, since, last_error,
       (julianday('now') - julianday(reported_at)) * 86400.0
FROM postbox_sink_health
ORDER BY sink, relay_id
