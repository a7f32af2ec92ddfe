-- One sink as a relay sees it now. Binds: relay id, sink, up, since, last error.
INSERT INTO postbox_sink_health (relay_id, sink, up, since, last_error)
VALUES (?, ?, ?, ?, ?)
