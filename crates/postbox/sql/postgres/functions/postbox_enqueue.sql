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
