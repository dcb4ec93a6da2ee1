-- What each user keeps of run answers, their events (GET /v1/runs/{id},
-- …/events) and Idempotency-Keys' answers, in bytes, bounded by
-- user_quota_answer_bytes: a row's kept_bytes (a run's answer and its kept
-- events, counted at its end; a key's answer) are added to its user's row
-- here, and taken off when they are forgotten (run_answer_ttl, a key's
-- day, or the user's oldest runs' past the quota).
ALTER TABLE runs ADD COLUMN kept_bytes bigint NOT NULL DEFAULT 0;
UPDATE runs SET kept_bytes = octet_length(answer) + coalesce((SELECT
    sum(octet_length(e.event) + octet_length(e.data) + 64) FROM run_events e
    WHERE e.run_id = runs.id), 0) WHERE answer IS NOT NULL;
ALTER TABLE idempotency_keys ADD COLUMN kept_bytes bigint NOT NULL DEFAULT 0;
UPDATE idempotency_keys SET kept_bytes = octet_length(answer) WHERE answer IS NOT NULL;
CREATE TABLE user_kept_answers (
    user_id text PRIMARY KEY,
    bytes   bigint NOT NULL DEFAULT 0
);
INSERT INTO user_kept_answers (user_id, bytes)
    SELECT user_id, sum(b) FROM (
        SELECT user_id, kept_bytes AS b FROM runs WHERE answer IS NOT NULL
        UNION ALL
        SELECT user_id, kept_bytes FROM idempotency_keys WHERE kept_bytes > 0) k
    GROUP BY user_id;
-- the user's oldest kept answers first
CREATE INDEX runs_user_kept ON runs (user_id, finished_at) WHERE answer IS NOT NULL;
