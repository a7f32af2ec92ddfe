-- The index of 0002_retry_due.sql, built online: producers go on inserting while it is built
-- (LOCK = NONE; the server refuses rather than block them). Like every online ALTER it waits for
-- the transactions that already read the table to end, and while it waits new statements on the
-- table queue behind it: lock_wait_timeout bounds that wait (and so the stall) to 5 s, and `postbox migrate` can
-- be run again when the long transaction is over.
SET SESSION lock_wait_timeout = 5;
ALTER TABLE outbox_events ADD INDEX outbox_events_retry_idx (retry_due, id),
    ALGORITHM = INPLACE, LOCK = NONE;
SET SESSION lock_wait_timeout = DEFAULT
