-- The server's version, e.g. 8.0.36 or 10.11.6-MariaDB (the store refuses one without SKIP LOCKED).
SELECT VERSION()
