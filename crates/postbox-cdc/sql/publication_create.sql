-- The outbox table's inserts, all the CDC relay reads (updates are the relay's own marks); on
-- PostgreSQL 15+ only the id column (a column list): the relay needs nothing else, and the
-- server then neither converts nor sends each row's payload.
CREATE PUBLICATION {publication} FOR TABLE {tables}
    WITH (publish = 'insert')
