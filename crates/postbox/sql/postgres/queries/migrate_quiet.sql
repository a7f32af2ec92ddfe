-- "already exists, skipping" notices are noise in an operator's log.
SET LOCAL client_min_messages = warning
