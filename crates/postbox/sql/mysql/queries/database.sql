-- The database the connection's URL names (MySQL's schema): the outbox lives there.
SELECT DATABASE()
