-- The floor of a relay's next claims (functions/postbox_floor.sql): $1 its last floor, $2 the
-- commit horizon + 1.
SELECT {schema}.postbox_floor($1::bigint, $2::bigint)
