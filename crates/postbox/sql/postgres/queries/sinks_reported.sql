-- What every relay last reported of its sinks: relay, sink, up, since, last error, and the
-- seconds since the report.
SELECT relay_id, sink, up, since, last_error, EXTRACT(EPOCH FROM now() - reported_at)::float8
FROM {schema}.postbox_sink_health
ORDER BY sink, relay_id
