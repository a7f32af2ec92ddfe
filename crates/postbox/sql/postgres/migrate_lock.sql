-- Serializes concurrent migrations of one schema ($1) for the rest of the transaction (several
-- relays starting at once).
SELECT pg_advisory_xact_lock(7012026, hashtext($1))
