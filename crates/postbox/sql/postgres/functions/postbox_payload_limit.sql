-- The largest payload accepted, in bytes: the setting postbox.payload_limit (for a session,
-- role or database: ALTER ROLE app SET postbox.payload_limit = '4MiB'), 1 MiB when unset, as
-- the Rust Outbox's default.
CREATE OR REPLACE FUNCTION {schema}.postbox_payload_limit()
RETURNS bigint
LANGUAGE plpgsql
STABLE
AS $limit$
DECLARE
    raw text := current_setting('postbox.payload_limit', true);
    bytes bigint;
BEGIN
    -- A custom setting that was set and reset in this session reads as '' rather than NULL.
    IF raw IS NULL OR btrim(raw) = '' THEN
        RETURN 1048576;
    END IF;
    bytes := {schema}.postbox_parse_bytes(raw);
    IF bytes IS NULL THEN
        RAISE EXCEPTION 'invalid setting postbox.payload_limit: % is not a size', quote_literal(raw)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Write a number of bytes, or one with a unit: 65536, 512KiB, 1MiB, 4MB.';
    END IF;
    RETURN bytes;
END
$limit$;
