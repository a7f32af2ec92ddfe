-- The functions installed in the schema and the checksum of each one's file.
SELECT name, checksum FROM {schema}.postbox_functions
