-- After a timed-out run nothing is captured; the next run then rescans the
-- whole workspace instead of trusting the kernel's record of the last scan.
ALTER TABLE sessions ADD COLUMN capture_rescan boolean NOT NULL DEFAULT false;
