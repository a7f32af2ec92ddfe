-- Validates one event as the Rust Outbox does (Event::validate) and returns the idempotency key
-- it is written with, NULL for none. `label` starts every error message: 'invalid event', or
-- 'invalid event events[3]' for the fourth event of a batch. Every error names the argument in
-- its message and in the error's column field, and nothing has been written when it is raised.
--
-- Text and jsonb values cannot hold a NUL character at all: PostgreSQL refuses one before any
-- function runs (SQLSTATE 22021 for text, 22P05 for \u0000 in JSON), so there is no check here.
CREATE OR REPLACE FUNCTION {schema}.postbox_event_key(
    label text,
    event_type text,
    aggregate_type text,
    aggregate_id text,
    payload jsonb,
    headers jsonb,
    idempotency_key text,
    without_idempotency_key boolean,
    event_class text,
    max_retries integer,
    today date,
    payload_limit bigint
)
RETURNS text
LANGUAGE plpgsql
STABLE
AS $check$
DECLARE
    key text;
    daily boolean := false;
    size bigint;
    bad_header text;
    bad_type text;
BEGIN
    IF event_type IS NULL OR event_type = '' THEN
        RAISE EXCEPTION '%: event_type is %', label,
                        CASE WHEN event_type IS NULL THEN 'NULL' ELSE 'empty' END
            USING ERRCODE = CASE WHEN event_type IS NULL THEN 'null_value_not_allowed'
                                 ELSE 'invalid_parameter_value' END,
                  COLUMN = 'event_type',
                  HINT = 'Every event needs a type, e.g. ''InvoiceCreated''.';
    END IF;
    -- The column widths of outbox_events (docs/architecture.md, "The table"), in characters as VARCHAR counts them.
    IF char_length(event_type) > 100 THEN
        RAISE EXCEPTION '%: event_type is % characters long; the limit is 100', label,
                        char_length(event_type)
            USING ERRCODE = 'string_data_right_truncation', COLUMN = 'event_type',
                  HINT = 'event_type is a VARCHAR(100) column.';
    END IF;
    IF char_length(aggregate_type) > 100 THEN
        RAISE EXCEPTION '%: aggregate_type is % characters long; the limit is 100', label,
                        char_length(aggregate_type)
            USING ERRCODE = 'string_data_right_truncation', COLUMN = 'aggregate_type',
                  HINT = 'aggregate_type is a VARCHAR(100) column.';
    END IF;
    IF char_length(aggregate_id) > 100 THEN
        RAISE EXCEPTION '%: aggregate_id is % characters long; the limit is 100', label,
                        char_length(aggregate_id)
            USING ERRCODE = 'string_data_right_truncation', COLUMN = 'aggregate_id',
                  HINT = 'aggregate_id is a VARCHAR(100) column.';
    END IF;
    IF char_length(event_class) > 255 THEN
        RAISE EXCEPTION '%: event_class is % characters long; the limit is 255', label,
                        char_length(event_class)
            USING ERRCODE = 'string_data_right_truncation', COLUMN = 'event_class',
                  HINT = 'event_class is a VARCHAR(255) column.';
    END IF;

    -- docs/architecture.md, "Idempotency keys": the caller's key, none, or the daily key when the event has an aggregate.
    IF coalesce(without_idempotency_key, false) THEN
        IF idempotency_key IS NOT NULL THEN
            RAISE EXCEPTION '%: idempotency_key and without_idempotency_key are both given', label
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'without_idempotency_key',
                      HINT = 'Give your own idempotency_key, or without_idempotency_key => true '
                             'for an event that is never a duplicate, not both.';
        END IF;
    ELSIF idempotency_key IS NOT NULL THEN
        key := idempotency_key;
    ELSIF aggregate_type IS NOT NULL AND aggregate_id IS NOT NULL THEN
        key := aggregate_type || ':' || aggregate_id || ':' || event_type || ':'
               || to_char(today, 'YYYY-MM-DD');
        daily := true;
    END IF;
    IF char_length(key) > 255 THEN
        RAISE EXCEPTION '%: idempotency_key is % characters long; the limit is 255', label,
                        char_length(key)
            USING ERRCODE = 'string_data_right_truncation', COLUMN = 'idempotency_key',
                  HINT = CASE WHEN daily
                         THEN 'The daily key joins aggregate_type, aggregate_id, event_type and '
                              'the date; give a shorter idempotency_key of your own, or '
                              'without_idempotency_key => true.'
                         ELSE 'idempotency_key is a VARCHAR(255) column.' END;
    END IF;

    IF headers IS NOT NULL THEN
        IF jsonb_typeof(headers) <> 'object' THEN
            RAISE EXCEPTION '%: headers is a JSON %; it must be an object', label,
                            jsonb_typeof(headers)
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'headers',
                      HINT = 'headers is a JSON object of string values, e.g. '
                             '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}.';
        END IF;
        -- Header values are strings, as the Rust Event's are, and as brokers carry them.
        SELECT h.key, jsonb_typeof(h.value) INTO bad_header, bad_type
        FROM jsonb_each(headers) AS h
        WHERE jsonb_typeof(h.value) <> 'string'
        LIMIT 1;
        IF bad_header IS NOT NULL THEN
            RAISE EXCEPTION '%: headers value of % is a JSON %; header values are strings', label,
                            to_jsonb(bad_header), bad_type
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'headers',
                      HINT = 'Write the value as a JSON string, e.g. {"attempt": "1"}.';
        END IF;
    END IF;

    IF payload IS NULL THEN
        RAISE EXCEPTION '%: payload is NULL', label
            USING ERRCODE = 'null_value_not_allowed', COLUMN = 'payload',
                  HINT = 'Every event needs a JSON payload; a JSON null is ''null''::jsonb.';
    END IF;
    -- Bytes of the JSON text as the relay reads and publishes it. PostgreSQL prints jsonb with a
    -- space after each ':' and ',', so this can be a little more than compact JSON's size.
    size := octet_length(payload::text);
    IF size > payload_limit THEN
        RAISE EXCEPTION '%: payload is % bytes; the limit is % bytes', label, size, payload_limit
            USING ERRCODE = 'program_limit_exceeded', COLUMN = 'payload',
                  HINT = 'Raise the setting postbox.payload_limit (e.g. SET postbox.payload_limit '
                         '= ''4MiB'', or ALTER ROLE … SET), or store the data elsewhere and send '
                         'a reference.';
    END IF;

    IF max_retries < 0 THEN
        RAISE EXCEPTION '%: max_retries is %; it must be 0 or more', label, max_retries
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'max_retries',
                  HINT = 'max_retries is how many tries the relay makes before FAILED (default 5).'; -- 5: postbox::DEFAULT_MAX_RETRIES
    END IF;
    RETURN key;
END
$check$;
