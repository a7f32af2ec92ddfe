-- What a CDC relay needs of the server: wal_level = logical, and a role that may replicate;
-- and whether publications take column lists (PostgreSQL 15+).
SELECT current_setting('wal_level') AS wal_level,
       current_user::text AS role,
       (SELECT r.rolreplication OR r.rolsuper FROM pg_roles r WHERE r.rolname = current_user)
           AS may_replicate,
       current_setting('server_version_num')::int >= 150000 AS column_lists
