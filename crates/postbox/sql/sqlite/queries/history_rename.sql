-- Renames a migration recorded under the name an earlier release gave it (?2) to its name now
-- (?1), the name of its file.
UPDATE postbox_schema_history SET name = ?1 WHERE name = ?2
