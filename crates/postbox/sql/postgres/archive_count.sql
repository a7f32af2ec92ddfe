-- A dry run of archive.sql: how many of the same rows would move. See postbox_archive_count
-- (migration 0006_retention.sql).
SELECT last_id, moved, done
FROM {schema}.postbox_archive_count(now() - $1::float8 * interval '1 second', $2::bigint,
                                    $3::integer)
