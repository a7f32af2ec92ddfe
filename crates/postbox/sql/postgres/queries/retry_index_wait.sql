-- How long the concurrent build of the retry index waits for transactions that are in its way;
-- past that it gives up and `postbox migrate` says so (the outbox works without the index).
SET lock_timeout = '2min'
