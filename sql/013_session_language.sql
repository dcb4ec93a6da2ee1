-- A session's language (SPEC §10.3), fixed when it starts: its kernels,
-- the first and every replacement, are of that language's kernelspec
-- (kernel_name, kernel_name_javascript, kernel_name_r). Sessions made
-- before it existed are Python's.
ALTER TABLE sessions ADD COLUMN language text NOT NULL DEFAULT 'python'
    CHECK (language IN ('python', 'javascript', 'r'));
