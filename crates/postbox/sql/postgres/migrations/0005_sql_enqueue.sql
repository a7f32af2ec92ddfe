-- The SQL API (docs/sql-api.md): postbox_enqueue and postbox_enqueue_many write events from any
-- language, inside the caller's own transaction, by the rules of the Rust Outbox: the same
-- validation, the same daily idempotency key (date in UTC), the same duplicate semantics and the
-- same debounced wake-up of the relays. Every outbox schema gets its own functions, writing to
-- its own table.
--
-- No EXCEPTION blocks: each one would open a subtransaction on every call, and a transaction
-- with many of them slows down every snapshot taken while it runs. Errors are raised before the
-- INSERT; PostgreSQL's own errors (an id that is taken) pass through unchanged.

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

-- Wakes the relays: pg_notify on Postbox's channel with the schema's name, delivered only if the
-- caller's transaction commits. PostgreSQL serializes the commits of all transactions that
-- notified, so a session notifies at most once per postbox.notify_interval (50 ms by default;
-- '0' for every call) for each schema, as one Rust Outbox does; a relay that was woken polls
-- briskly for a while (busy_period) and finds the events committed in between.
--
-- The time of the last notification is a session setting. A transaction that rolls back takes
-- its setting with it, as it takes its notification: the session's next enqueue notifies.
CREATE OR REPLACE FUNCTION {schema}.postbox_notify(schema_name text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
AS $notify$
DECLARE
    setting text := 'postbox.notified_at_' || schema_name;
    last text := current_setting(setting, true);
    raw text := current_setting('postbox.notify_interval', true);
    interval_ms bigint := 50;
    now_us bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
BEGIN
    IF raw IS NOT NULL AND btrim(raw) <> '' THEN
        interval_ms := {schema}.postbox_parse_millis(raw);
        IF interval_ms IS NULL THEN
            RAISE EXCEPTION 'invalid setting postbox.notify_interval: % is not a duration',
                            quote_literal(raw)
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Write milliseconds, or a number with a unit: 0, 50ms, 1s.';
        END IF;
    END IF;
    -- A clock that went back notifies rather than waiting.
    IF interval_ms > 0 AND last ~ '^[0-9]{1,18}$'
       AND now_us - last::bigint >= 0 AND now_us - last::bigint < interval_ms * 1000 THEN
        RETURN;
    END IF;
    PERFORM pg_notify('postbox_events', schema_name);
    PERFORM set_config(setting, now_us::text, false);
END
$notify$;

-- One event, in the caller's transaction. Returns the new event's id, or NULL when an event
-- with the same idempotency key exists (a duplicate: nothing is written). Only an idempotency
-- key that exists makes a duplicate; any other conflict (an id that is taken) is an error.
--
-- idempotency_key: NULL (the default) for the daily key
-- {aggregate_type}:{aggregate_id}:{event_type}:{UTC date} when the event has an aggregate, and
-- none when it has not; a key of your own; or without_idempotency_key => true for none at all
-- (Event::without_idempotency_key). A NULL headers, max_retries or schema_version is the default.
--
-- search_path is pinned to the function's own schema: names cannot be captured by the caller's
-- search_path, and current_schema() is the schema's name, the notification's payload.
CREATE OR REPLACE FUNCTION {schema}.postbox_enqueue(
    event_type text,
    aggregate_type text,
    aggregate_id text,
    payload jsonb,
    headers jsonb DEFAULT '{}',
    idempotency_key text DEFAULT NULL,
    event_class text DEFAULT NULL,
    schema_version integer DEFAULT 1,
    max_retries integer DEFAULT 5, -- 5: postbox::DEFAULT_MAX_RETRIES
    without_idempotency_key boolean DEFAULT false
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = {schema}
AS $enqueue$
#variable_conflict use_column
DECLARE
    key text := {schema}.postbox_event_key(
        'invalid event', postbox_enqueue.event_type, postbox_enqueue.aggregate_type,
        postbox_enqueue.aggregate_id, postbox_enqueue.payload, postbox_enqueue.headers,
        postbox_enqueue.idempotency_key, postbox_enqueue.without_idempotency_key,
        postbox_enqueue.event_class, postbox_enqueue.max_retries,
        (statement_timestamp() AT TIME ZONE 'UTC')::date, {schema}.postbox_payload_limit());
    new_id bigint;
BEGIN
    INSERT INTO {schema}.outbox_events AS e
        (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
         idempotency_key, max_retries)
    VALUES (postbox_enqueue.event_type, postbox_enqueue.aggregate_type,
            postbox_enqueue.aggregate_id, postbox_enqueue.payload, postbox_enqueue.event_class,
            coalesce(postbox_enqueue.schema_version, 1),
            coalesce(postbox_enqueue.headers, '{}'::jsonb), key,
            coalesce(postbox_enqueue.max_retries, 5)) -- 5: postbox::DEFAULT_MAX_RETRIES
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING e.id INTO new_id;
    -- Whether or not the event was a duplicate: a session whose turn it is notifies, or the
    -- events it enqueues next would wait for the relays' poll.
    PERFORM {schema}.postbox_notify(current_schema());
    RETURN new_id;
END
$enqueue$;

COMMENT ON FUNCTION {schema}.postbox_enqueue(text, text, text, jsonb, jsonb, text, text, integer,
                                             integer, boolean) IS
'Postbox: writes one event in the caller''s transaction; returns its id, or NULL for a duplicate '
'idempotency key. See docs/sql-api.md.';

-- Many events, in the caller's transaction: `events` is a JSON array of objects with the
-- arguments of postbox_enqueue as fields (event_type and payload required). Every event is
-- validated before anything is written; an error names the event by its index from 0
-- (events[3]). Returns the ids in input order, NULL for each duplicate (of an existing event, or
-- of an earlier event of the same batch). One notification for the batch, as postbox_enqueue.
CREATE OR REPLACE FUNCTION {schema}.postbox_enqueue_many(events jsonb)
RETURNS bigint[]
LANGUAGE plpgsql
VOLATILE
SET search_path = {schema}
AS $many$
#variable_conflict use_column
DECLARE
    today date := (statement_timestamp() AT TIME ZONE 'UTC')::date;
    payload_limit bigint := {schema}.postbox_payload_limit();
    ev jsonb;
    i integer;
    label text;
    field text;
    kind text;
    want text;
    n integer;
    event_types text[] := '{}';
    aggregate_types text[] := '{}';
    aggregate_ids text[] := '{}';
    payloads jsonb[] := '{}';
    event_classes text[] := '{}';
    schema_versions integer[] := '{}';
    headers jsonb[] := '{}';
    keys text[] := '{}';
    max_retries integer[] := '{}';
    new_id bigint;
    ids bigint[] := '{}';
BEGIN
    IF events IS NULL OR jsonb_typeof(events) <> 'array' THEN
        RAISE EXCEPTION 'invalid events: events is %',
                        coalesce('a JSON ' || jsonb_typeof(events), 'NULL')
            USING ERRCODE = CASE WHEN events IS NULL THEN 'null_value_not_allowed'
                                 ELSE 'invalid_parameter_value' END,
                  COLUMN = 'events',
                  HINT = 'Pass a JSON array of event objects, e.g. [{"event_type": '
                         '"InvoiceCreated", "aggregate_type": "Invoice", "aggregate_id": "456", '
                         '"payload": {"invoice_id": 456}}].';
    END IF;
    FOR ev, i IN SELECT e.value, e.ordinality - 1 FROM jsonb_array_elements(events) WITH ORDINALITY AS e
    LOOP
        label := format('invalid event events[%s]', i);
        IF jsonb_typeof(ev) <> 'object' THEN
            RAISE EXCEPTION '%: the event is a JSON %; it must be an object', label,
                            jsonb_typeof(ev)
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'events';
        END IF;
        -- Each field's JSON type. An unknown field is refused: a misspelt idempotency_key would
        -- otherwise quietly give the event its daily key.
        FOR field, kind IN SELECT f.key, jsonb_typeof(f.value) FROM jsonb_each(ev) AS f LOOP
            want := CASE
                WHEN field IN ('event_type', 'aggregate_type', 'aggregate_id', 'idempotency_key',
                               'event_class') THEN 'string'
                WHEN field = 'headers' THEN 'object'
                WHEN field IN ('schema_version', 'max_retries') THEN 'whole number'
                WHEN field = 'without_idempotency_key' THEN 'boolean'
                WHEN field = 'payload' THEN kind
            END;
            IF want IS NULL THEN
                RAISE EXCEPTION '%: unknown field %', label, to_jsonb(field)
                    USING ERRCODE = 'invalid_parameter_value', COLUMN = field,
                          HINT = 'The fields are postbox_enqueue''s arguments: event_type, '
                                 'aggregate_type, aggregate_id, payload, headers, '
                                 'idempotency_key, without_idempotency_key, event_class, '
                                 'schema_version, max_retries.';
            END IF;
            -- A JSON null is the same as a missing field (a payload's is the JSON null payload).
            IF kind <> 'null' AND kind <> want
               AND NOT (want = 'whole number' AND kind = 'number'
                        AND (ev ->> field) ~ '^-?[0-9]{1,9}$') THEN
                RAISE EXCEPTION '%: % is a JSON %; it must be a %', label, field,
                                CASE WHEN kind = 'number' THEN 'number ' || (ev ->> field)
                                     ELSE kind END,
                                CASE WHEN want = 'object' THEN 'JSON object of string values'
                                     WHEN want = 'whole number' THEN 'whole number'
                                     ELSE 'JSON ' || want END
                    USING ERRCODE = 'invalid_parameter_value', COLUMN = field;
            END IF;
        END LOOP;
        keys := array_append(keys, {schema}.postbox_event_key(
            label, ev ->> 'event_type', ev ->> 'aggregate_type', ev ->> 'aggregate_id',
            ev -> 'payload', nullif(ev -> 'headers', 'null'), ev ->> 'idempotency_key',
            (ev ->> 'without_idempotency_key')::boolean, ev ->> 'event_class',
            (ev ->> 'max_retries')::integer, today, payload_limit));
        event_types := array_append(event_types, ev ->> 'event_type');
        aggregate_types := array_append(aggregate_types, ev ->> 'aggregate_type');
        aggregate_ids := array_append(aggregate_ids, ev ->> 'aggregate_id');
        payloads := array_append(payloads, ev -> 'payload');
        event_classes := array_append(event_classes, ev ->> 'event_class');
        schema_versions := array_append(schema_versions,
                                       coalesce((ev ->> 'schema_version')::integer, 1));
        headers := array_append(headers, coalesce(nullif(ev -> 'headers', 'null'), '{}'::jsonb));
        max_retries := array_append(max_retries, coalesce((ev ->> 'max_retries')::integer, 5)); -- 5: postbox::DEFAULT_MAX_RETRIES
    END LOOP;
    n := coalesce(array_length(event_types, 1), 0);
    IF n = 0 THEN
        RETURN ids;
    END IF;
    -- One INSERT per event: each id is then known to belong to its event, and an event whose key
    -- an earlier event of the batch wrote is a duplicate of it, as in the Rust Outbox.
    FOR i IN 1 .. n LOOP
        new_id := NULL;
        INSERT INTO {schema}.outbox_events AS e
            (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version,
             headers, idempotency_key, max_retries)
        VALUES (event_types[i], aggregate_types[i], aggregate_ids[i], payloads[i],
                event_classes[i], schema_versions[i], headers[i], keys[i], max_retries[i])
        ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING e.id INTO new_id;
        ids := array_append(ids, new_id);
    END LOOP;
    PERFORM {schema}.postbox_notify(current_schema());
    RETURN ids;
END
$many$;

COMMENT ON FUNCTION {schema}.postbox_enqueue_many(jsonb) IS
'Postbox: writes a JSON array of events in the caller''s transaction; returns their ids in input '
'order, NULL for duplicates. See docs/sql-api.md.';
