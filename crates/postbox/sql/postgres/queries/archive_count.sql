-- A dry run of archive.sql: how many of the same rows would move. See
-- functions/postbox_archive_count.sql.
SELECT last_id, moved, done
FROM {schema}.postbox_archive_count(now() - $1::float8 * interval '1 second', $2::bigint,
                                    $3::integer)
