-- A kernel that codexec itself just started or restarted is expected to be
-- fresh on the next run; any other fresh kernel was restarted behind our
-- back and the run reports session.reset.
ALTER TABLE sessions ADD COLUMN kernel_fresh boolean NOT NULL DEFAULT true;
