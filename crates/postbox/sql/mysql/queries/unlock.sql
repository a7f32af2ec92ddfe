-- Gives back the named lock of lock.sql (? the task's prefix).
DO RELEASE_LOCK(CONCAT(?, DATABASE()))
