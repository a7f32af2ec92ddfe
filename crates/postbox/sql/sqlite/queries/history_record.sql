-- Records migration ?1 as applied.
INSERT INTO postbox_schema_history (name) VALUES (?1)
