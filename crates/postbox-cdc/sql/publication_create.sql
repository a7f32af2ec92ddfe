-- The outbox table's inserts, all the CDC relay reads (updates are the relay's own marks).
CREATE PUBLICATION {publication} FOR TABLE {schema}.outbox_events WITH (publish = 'insert')
