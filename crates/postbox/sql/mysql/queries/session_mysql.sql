-- On MySQL (not MariaDB): live information_schema table statistics, whose AUTO_INCREMENT (see
-- head.sql) is otherwise cached for a day.
SET SESSION information_schema_stats_expiry = 0
