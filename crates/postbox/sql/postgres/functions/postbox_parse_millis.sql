-- A duration setting in milliseconds: a number of milliseconds, or with a unit (ms, s, m or
-- min). NULL when the text is not a duration.
CREATE OR REPLACE FUNCTION {schema}.postbox_parse_millis(raw text)
RETURNS bigint
LANGUAGE sql
IMMUTABLE
AS $millis$
SELECT m[1]::bigint * CASE lower(m[2])
                          WHEN '' THEN 1 WHEN 'ms' THEN 1
                          WHEN 's' THEN 1000 WHEN 'm' THEN 60000 WHEN 'min' THEN 60000
                      END
FROM (SELECT regexp_match(raw, '^[[:space:]]*([0-9]{1,12})[[:space:]]*([A-Za-z]*)[[:space:]]*$')) AS r(m)
$millis$;
