-- Outbox tables of tenants no longer served (suspended), taken out of the publication: the
-- server stops decoding their inserts for the slot.
ALTER PUBLICATION {publication} DROP TABLE {tables}
