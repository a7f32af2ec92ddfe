-- Each consumer of the inbox: the messages it has handled (counted up to $1, so that a large
-- inbox is not read whole: `messages` = $1 means at least that many), and the repeats it skipped.
-- The consumers are found by hopping over the primary key, a descent per consumer.
WITH RECURSIVE consumers AS (
    (SELECT consumer FROM {schema}.inbox_messages ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT m.consumer FROM {schema}.inbox_messages m
            WHERE m.consumer > c.consumer ORDER BY m.consumer LIMIT 1)
    FROM consumers c
    WHERE c.consumer IS NOT NULL
)
SELECT c.consumer::text,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.inbox_messages m
                              WHERE m.consumer = c.consumer LIMIT $1) x) AS messages,
       (SELECT coalesce(sum(m.duplicates), 0) FROM {schema}.inbox_messages m
        WHERE m.consumer = c.consumer AND m.duplicates > 0)::bigint AS duplicates
FROM consumers c
WHERE c.consumer IS NOT NULL
ORDER BY c.consumer
