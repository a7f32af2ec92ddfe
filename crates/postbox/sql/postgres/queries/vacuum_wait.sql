-- The vacuum waits for an autovacuum worker to give way, not for an operator's vacuum.
SET lock_timeout = '60s'
