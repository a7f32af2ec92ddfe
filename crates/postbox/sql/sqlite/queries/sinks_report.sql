-- One sink as a relay sees it now: relay id, sink, up, since, last error.
INSERT INTO postbox_sink_health (relay_id, sink, up, since, last_error)
VALUES (?1, ?2, ?3, ?4, ?5)
