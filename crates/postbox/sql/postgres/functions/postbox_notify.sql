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
