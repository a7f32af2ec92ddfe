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
