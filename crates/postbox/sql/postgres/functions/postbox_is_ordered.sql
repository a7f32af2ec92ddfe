-- Whether `aggregate_type` is one of `ordered` ('*' for all).
CREATE OR REPLACE FUNCTION {schema}.postbox_is_ordered(aggregate_type text, aggregate_id text,
                                            ordered text[])
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $ordered$
SELECT aggregate_id IS NOT NULL AND aggregate_type IS NOT NULL
       AND cardinality(ordered) > 0
       AND (aggregate_type = ANY(ordered) OR '*' = ANY(ordered))
$ordered$;
