SELECT count(*) FILTER (WHERE status = 'PENDING'),
       count(*) FILTER (WHERE status = 'PROCESSING'),
       count(*) FILTER (WHERE status = 'PROCESSED'),
       count(*) FILTER (WHERE status = 'FAILED'),
       EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE status IN ('PENDING', 'PROCESSING')))::float8
FROM {schema}.outbox_events
