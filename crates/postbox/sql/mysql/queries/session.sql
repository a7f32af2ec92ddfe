-- Every session of a store's pool: each statement of a claim sees what other relays committed
-- before it.
SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED
