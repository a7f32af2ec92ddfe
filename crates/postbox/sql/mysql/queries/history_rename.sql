-- Renames a migration recorded under the name an earlier release gave it (the second parameter)
-- to its name now (the first), the name of its file.
UPDATE postbox_schema_history SET name = ? WHERE name = ?
