SELECT count(*),
       EXTRACT(EPOCH FROM GREATEST(min(coalesce(locked_until, now())) - now(), interval '0'))::float8
FROM {schema}.outbox_events
WHERE status IN ('PENDING', 'PROCESSING')
