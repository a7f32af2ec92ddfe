-- Outbox tables added to a publication that exists without them: the default schema's, or
-- active tenants' (a few hundred per statement); only the id column on PostgreSQL 15+. The
-- slot delivers their inserts from this statement on.
ALTER PUBLICATION {publication} ADD TABLE {tables}
