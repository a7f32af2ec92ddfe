-- Records that a function ($1) was installed from the file with checksum $2.
INSERT INTO {schema}.postbox_functions (name, checksum) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, installed_at = now()
