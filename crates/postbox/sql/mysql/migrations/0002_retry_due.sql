-- Where a relay's claims find the events below its floor that went wrong once (a failed try
-- backing off, an event put back while its destination was down, a lease taken over, an
-- operator's retry, the slow lane): all of them have last_error set and are neither PROCESSED nor
-- FAILED. MySQL has no partial index, so this virtual column is NULL for every other event and
-- the index on it (0003_retry_index.sql) finds them without reading the processed history, nor
-- the entries the marks left behind in (status, id) while a long transaction keeps InnoDB's purge
-- from removing them. Its value is when the event is due: its lease or backoff, or long ago.
--
-- Virtual and invisible: adding it writes no row (no table rewrite, no long lock) and `SELECT *`
-- and `INSERT ... VALUES` without a column list see the table as before.
ALTER TABLE outbox_events
    ADD COLUMN retry_due DATETIME(6)
        AS (IF(last_error IS NOT NULL AND status IN ('PENDING', 'PROCESSING'),
               COALESCE(locked_until, TIMESTAMP '1000-01-01 00:00:00'), NULL)) VIRTUAL INVISIBLE
