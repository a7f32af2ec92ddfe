-- A relay's ($1) earlier report of its sinks, and every report older than a day, removed.
DELETE FROM {schema}.postbox_sink_health
WHERE relay_id = $1 OR reported_at < now() - interval '1 day'
