-- Age in seconds of the oldest open transaction but this session's: a long one keeps InnoDB's
-- purge from removing old row versions.
SELECT MAX(TIMESTAMPDIFF(MICROSECOND, trx_started, NOW(6))) / 1e6
FROM information_schema.INNODB_TRX
WHERE trx_mysql_thread_id <> CONNECTION_ID()
