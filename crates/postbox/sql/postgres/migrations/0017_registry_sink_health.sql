-- What each relay last saw of its sinks: `postbox status` shows the ones that are down, and
-- since when. Relays report every few seconds while they run; rows of relays that stopped
-- reporting are shown as stale and removed after a day.
CREATE TABLE {schema}.postbox_sink_health (
    relay_id    TEXT        NOT NULL,
    sink        TEXT        NOT NULL,
    up          BOOLEAN     NOT NULL,
    since       TIMESTAMPTZ NOT NULL,
    last_error  TEXT,
    reported_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (relay_id, sink)
);
