-- The logical replication slots CDC relays (postbox-cdc) read this schema's outbox from: a CDC
-- relay records its slot's name when it starts. A polling relay that finds one of them active
-- (a reader holds it) leaves the schema's events to that reader, which publishes them without a
-- claim a poller could see (PgStore::leave_to_cdc_relay).
CREATE TABLE {schema}.postbox_cdc_slots (
    slot_name TEXT        PRIMARY KEY,
    since     TIMESTAMPTZ NOT NULL DEFAULT now()
);
