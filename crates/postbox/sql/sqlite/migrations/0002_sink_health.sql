-- What each relay last saw of its sinks (see the PostgreSQL migration of the same name).
CREATE TABLE postbox_sink_health (
    relay_id    TEXT    NOT NULL,
    sink        TEXT    NOT NULL,
    up          INTEGER NOT NULL,
    since       TEXT    NOT NULL,
    last_error  TEXT,
    reported_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (relay_id, sink)
);
