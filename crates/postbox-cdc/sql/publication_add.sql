-- A publication that exists without this schema's outbox table.
ALTER PUBLICATION {publication} ADD TABLE {schema}.outbox_events {columns}
