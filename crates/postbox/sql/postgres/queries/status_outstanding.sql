-- One schema's line of StoreOps::status_outstanding: what waits in its outbox (the events not
-- done and the FAILED ones, through their partial indexes; never the processed history) and the
-- age of the oldest outstanding event. The store joins one line per target with UNION ALL, a
-- hundred per statement, in a transaction that turns sequential and bitmap scans off (as
-- functions/postbox_status.sql does); {n} is the target's place in the list.
SELECT {n}::integer AS n,
       (SELECT count(*) FROM {schema}.outbox_events e WHERE e.status = 'PENDING') AS pending,
       (SELECT count(*) FROM {schema}.outbox_events e WHERE e.status = 'PROCESSING') AS processing,
       (SELECT count(*) FROM {schema}.outbox_events e WHERE e.status = 'FAILED') AS failed,
       (SELECT EXTRACT(EPOCH FROM now() - min(e.created_at))::float8
        FROM {schema}.outbox_events e
        WHERE e.status IN ('PENDING', 'PROCESSING')) AS oldest
