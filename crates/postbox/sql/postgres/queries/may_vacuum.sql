-- Whether this role may vacuum schema $1's outbox table (its owner, a member of the owner's role,
-- or a superuser); no row when there is no such table.
SELECT pg_has_role(c.relowner, 'USAGE')
       OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = 'outbox_events'
