-- What a run answered (the JSON POST /v1/runs returned or streamed as its
-- result event), so that a client that went away before the end finds it
-- with GET /v1/runs/{id}. Cleared after run_answer_ttl; the run's record
-- itself stays. Text, exactly as answered: jsonb refuses the \u0000 a
-- kernel may print and rewrites numbers.
ALTER TABLE runs ADD COLUMN answer text;
CREATE INDEX runs_answer_kept ON runs (finished_at) WHERE answer IS NOT NULL;
