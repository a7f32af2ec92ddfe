-- Records migration ? as applied.
INSERT INTO postbox_schema_history (name) VALUES (?)
