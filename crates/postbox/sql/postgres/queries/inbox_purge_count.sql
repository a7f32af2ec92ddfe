-- A dry run of inbox_purge.sql: how many inbox rows were received more than $1 seconds ago.
SELECT count(*) FROM {schema}.inbox_messages
WHERE received_at < now() - $1::float8 * interval '1 second'
