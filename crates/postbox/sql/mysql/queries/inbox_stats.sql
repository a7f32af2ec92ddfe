-- Each consumer of the inbox: the messages it has handled (reported up to ?, as on the other
-- stores) and the repeats it skipped. MariaDB cannot refer to an outer row from inside a derived
-- table, so the capped count of the PostgreSQL statement is not written here: this reads the
-- primary key whole, once. Binds: the count's cap.
SELECT consumer, LEAST(count(*), ?) AS messages, CAST(sum(duplicates) AS SIGNED) AS duplicates
FROM inbox_messages
GROUP BY consumer
ORDER BY consumer
