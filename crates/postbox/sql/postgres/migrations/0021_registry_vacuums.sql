-- What held vacuum back when a relay last vacuumed each outbox table of this deployment (the
-- oldest transaction id a vacuum keeps row versions for: StoreOps::vacuum_horizon). A relay
-- started later, or another relay, does not vacuum that table again while the same
-- transaction holds vacuum back: that vacuum would read the whole table and remove nothing the
-- last one left.
CREATE TABLE {schema}.postbox_vacuums (
    schema_name TEXT        PRIMARY KEY,
    held_by     TEXT        NOT NULL,
    vacuumed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
