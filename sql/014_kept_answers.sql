-- What each user keeps of run answers and events (GET /v1/runs/{id},
-- …/events), in bytes, bounded by user_quota_answer_bytes: a run's
-- kept_bytes (its answer and its kept events, counted at its end) are
-- added to its user's row here, and taken off when they are forgotten
-- (run_answer_ttl, or the user's oldest ones past the quota).
ALTER TABLE runs ADD COLUMN kept_bytes bigint NOT NULL DEFAULT 0;
UPDATE runs SET kept_bytes = octet_length(answer) + coalesce((SELECT
    sum(octet_length(e.event) + octet_length(e.data)) FROM run_events e
    WHERE e.run_id = runs.id), 0) WHERE answer IS NOT NULL;
CREATE TABLE user_kept_answers (
    user_id text PRIMARY KEY,
    bytes   bigint NOT NULL DEFAULT 0
);
INSERT INTO user_kept_answers (user_id, bytes)
    SELECT user_id, sum(kept_bytes) FROM runs WHERE answer IS NOT NULL GROUP BY user_id;
-- the user's oldest kept answers first
CREATE INDEX runs_user_kept ON runs (user_id, finished_at) WHERE answer IS NOT NULL;
