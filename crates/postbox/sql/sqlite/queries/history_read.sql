-- The names of the migrations applied so far.
SELECT name FROM postbox_schema_history
