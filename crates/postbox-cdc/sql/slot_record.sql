-- The slot this CDC relay reads the schema's outbox from (migration 0020_registry_cdc_slots):
-- polling relays that find it active leave the schema's events to its reader.
INSERT INTO {schema}.postbox_cdc_slots (slot_name) VALUES ($1)
ON CONFLICT (slot_name) DO NOTHING
