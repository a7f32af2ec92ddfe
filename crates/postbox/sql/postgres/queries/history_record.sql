-- Records migration $1 as applied.
INSERT INTO {schema}.postbox_schema_history (name) VALUES ($1)
