-- Each consumer of the inbox: the messages it has handled (counted up to ?1) and the repeats it
-- skipped (see the PostgreSQL statement).
WITH RECURSIVE consumers(consumer) AS (
    SELECT min(consumer) FROM inbox_messages
    UNION ALL
    SELECT (SELECT min(m.consumer) FROM inbox_messages m WHERE m.consumer > c.consumer)
    FROM consumers c
    WHERE c.consumer IS NOT NULL
)
SELECT c.consumer,
       (SELECT count(*) FROM (SELECT 1 FROM inbox_messages m
                              WHERE m.consumer = c.consumer LIMIT ?1)) AS messages,
       (SELECT coalesce(sum(m.duplicates), 0) FROM inbox_messages m
        WHERE m.consumer = c.consumer AND m.duplicates > 0) AS duplicates
FROM consumers c
WHERE c.consumer IS NOT NULL
ORDER BY c.consumer
