-- Takes this database's named lock for a task (? the task's prefix, e.g. postbox_retention:) on
-- the session, waiting ? seconds at most: 1 when taken.
SELECT GET_LOCK(CONCAT(?, DATABASE()), ?)
