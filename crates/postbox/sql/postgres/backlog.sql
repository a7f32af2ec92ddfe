SELECT count(*),
       -- NULL when nothing is outstanding; a negative wait (overdue) is read as zero.
       EXTRACT(EPOCH FROM min(coalesce(locked_until, now())) - now())::float8
FROM {schema}.outbox_events
WHERE status IN ('PENDING', 'PROCESSING')
