-- A pooled kernel is recorded the moment it starts, while it warms
-- (ready false: nobody claims it yet), so that a process that dies during
-- the warm-up leaves a kernel the next refill removes, and the reaper can
-- take any kernel no row names for a minute as an orphan (a crash's), not
-- the two minutes a warm-up may last.
ALTER TABLE prestarted_kernels ADD COLUMN ready boolean NOT NULL DEFAULT true;
