-- Active tenants' outbox tables added to the publication (only the id column on PostgreSQL
-- 15+, as the default schema's): the slot delivers their inserts from this statement on.
ALTER PUBLICATION {publication} ADD TABLE {tables}
