-- A size setting in bytes: a number, or with a unit as in Postbox's configuration (B, KB, KiB,
-- MB, MiB; KB and MB are powers of ten). NULL when the text is not a size.
CREATE OR REPLACE FUNCTION {schema}.postbox_parse_bytes(raw text)
RETURNS bigint
LANGUAGE sql
IMMUTABLE
AS $bytes$
SELECT m[1]::bigint * CASE lower(m[2])
                          WHEN '' THEN 1 WHEN 'b' THEN 1
                          WHEN 'kb' THEN 1000 WHEN 'kib' THEN 1024
                          WHEN 'mb' THEN 1000000 WHEN 'mib' THEN 1048576
                      END
FROM (SELECT regexp_match(raw, '^[[:space:]]*([0-9]{1,12})[[:space:]]*([A-Za-z]*)[[:space:]]*$')) AS r(m)
$bytes$;
