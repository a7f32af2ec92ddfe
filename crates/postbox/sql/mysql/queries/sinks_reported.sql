-- What every relay last reported of its sinks: relay, sink, up, since, last error, and the
-- seconds since the report.
SELECT relay_id, sink, up, since, last_error,
       TIMESTAMPDIFF(MICROSECOND, reported_at, UTC_TIMESTAMP(6)) / 1e6
FROM postbox_sink_health
ORDER BY sink, relay_id
