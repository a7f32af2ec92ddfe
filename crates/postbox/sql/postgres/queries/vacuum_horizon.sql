-- The oldest transaction id for which a VACUUM of this database's tables keeps dead row versions
-- (as text), or NULL when nothing holds vacuum back: a snapshot (backend_xmin: a report, a
-- pg_dump, a standby's feedback through its WAL sender), a transaction that wrote (backend_xid),
-- a prepared transaction, or a replication slot's xmin. While it stays the same, a second
-- vacuum removes nothing the first left: whatever died before it was removable then.
SELECT h.x::text
FROM (SELECT a.backend_xmin AS x
      FROM pg_stat_activity a
      WHERE (a.datname = current_database() OR a.datname IS NULL)
        AND a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
      UNION ALL
      SELECT a.backend_xid
      FROM pg_stat_activity a
      WHERE (a.datname = current_database() OR a.datname IS NULL)
        AND a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()
      UNION ALL
      SELECT p.transaction FROM pg_prepared_xacts p WHERE p.database = current_database()
      UNION ALL
      SELECT s.xmin FROM pg_replication_slots s WHERE s.xmin IS NOT NULL) h
ORDER BY age(h.x) DESC
LIMIT 1
