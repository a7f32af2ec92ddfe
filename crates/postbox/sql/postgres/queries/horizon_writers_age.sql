-- How long the oldest of a commit-horizon probe's writers ($1: their virtual transaction ids,
-- as postbox_horizon took them) has been in its transaction, in seconds; NULL when none of them
-- is open any more. A prepared transaction (`-1/<xid>`) counts from when it was prepared.
SELECT EXTRACT(EPOCH FROM now() - min(started))::float8
FROM (
    SELECT a.xact_start AS started
    FROM pg_locks l
    JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'virtualxid'
      AND l.virtualxid = ANY($1::text[])
    UNION ALL
    SELECT p.prepared
    FROM pg_prepared_xacts p
    WHERE '-1/' || p.transaction::text = ANY($1::text[])
) w
