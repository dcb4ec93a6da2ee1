-- Runs that outlive their client (SPEC §10.3).
--
-- owner_pid and owner_started name the PostgreSQL connection of the thread
-- that executes a run: a run still "running" whose connection is gone lost
-- its process (a crash, a kill) and is ended as an error by the next sweep,
-- not after the longest run could last. cancel_requested is set by
-- POST /v1/runs/{id}/cancel; the notice "cancel <id>" tells the process
-- running it at once.
ALTER TABLE runs ADD COLUMN owner_pid integer;
ALTER TABLE runs ADD COLUMN owner_started timestamptz;
ALTER TABLE runs ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
CREATE INDEX runs_running ON runs (started_at) WHERE status = 'running';

-- The events of a run started with wait: false or streamed, in order, for
-- GET /v1/runs/{id}/events: replayed from the start, resumed after an id.
-- The final result is not kept here: it is the run's answer (runs.answer).
-- Bounded per run by the server; forgotten with the answer.
CREATE TABLE run_events (
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq    integer NOT NULL,
    event  text NOT NULL,
    data   text NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- Idempotency-Key (SPEC §10.3): what the first request with a key answered,
-- per user, for a day. fingerprint is the SHA-256 of what made the request
-- (method, route, its JSON body or a streamed body's length and type);
-- body_sha256 that of a streamed body as read. status is NULL while the
-- first is in progress, by the connection owner_*; a run's answer may be
-- its record's (answer NULL, run_id set).
CREATE TABLE idempotency_keys (
    user_id       text NOT NULL,
    key           text NOT NULL,
    fingerprint   text NOT NULL,
    body_sha256   text,
    run_id        uuid,
    status        integer,
    answer        text,
    owner_pid     integer,
    owner_started timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);
