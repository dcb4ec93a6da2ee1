-- A session whose cleanup failed (its workspace could not be deleted, the
-- gateway was down) is retried later, each time later still, so that no
-- number of such rows holds up the reaping of the others.
ALTER TABLE sessions ADD COLUMN cleanup_failures integer NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cleanup_after timestamptz;
