-- What held vacuum back when the outbox table of schema $1 was last vacuumed by a relay
-- (migration 0021_registry_vacuums): the transaction id as vacuum_horizon.sql gives it.
SELECT v.held_by FROM {schema}.postbox_vacuums v WHERE v.schema_name = $1
