-- The names of the migrations applied so far.
SELECT name FROM {schema}.postbox_schema_history
