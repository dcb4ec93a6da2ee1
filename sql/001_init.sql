-- codexec schema, version 1.
-- Users are names (text) chosen by the operator; every row a user can touch
-- carries user_id, and every query a user can reach filters on it.

CREATE TABLE api_keys (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id          text NOT NULL CHECK (length(user_id) BETWEEN 1 AND 256),
    label            text,
    key_hash         bytea NOT NULL UNIQUE,      -- keyed BLAKE2b of the key
    key_prefix       text NOT NULL,              -- first characters, for operators
    require_approval boolean NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    revoked_at       timestamptz,
    last_used_at     timestamptz
);
CREATE INDEX api_keys_user ON api_keys (user_id);

CREATE TABLE sessions (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id         text NOT NULL,
    conversation_id text NOT NULL,
    gateway_url     text NOT NULL,
    kernel_id       text,
    workspace       text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_used_at    timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    UNIQUE (user_id, conversation_id)
);
CREATE INDEX sessions_expiry ON sessions (expires_at);

CREATE TABLE runs (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id         text NOT NULL,
    conversation_id text NOT NULL,
    api_key_id      uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    status          text NOT NULL CHECK (status IN
                      ('pending_approval', 'rejected', 'expired', 'running', 'ok', 'error')),
    code_length     integer NOT NULL,
    code_sha256     text NOT NULL,
    error_name      text,
    truncated       boolean NOT NULL DEFAULT false,
    session_reset   boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    execution_ms    integer
);
CREATE INDEX runs_user_conversation ON runs (user_id, conversation_id, created_at);

-- A run waiting for approval needs its request until it is decided; the row
-- is deleted when the run is approved, rejected or expires.
CREATE TABLE pending_runs (
    run_id     uuid PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    request    jsonb NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE TABLE artifacts (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id         text NOT NULL,
    conversation_id text NOT NULL,
    path            text NOT NULL,
    kind            text NOT NULL,
    current_version integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    deleted_at      timestamptz
);
CREATE UNIQUE INDEX artifacts_path ON artifacts (user_id, conversation_id, path)
    WHERE deleted_at IS NULL;

CREATE TABLE artifact_versions (
    artifact_id uuid NOT NULL REFERENCES artifacts (id) ON DELETE CASCADE,
    version     integer NOT NULL CHECK (version >= 1),
    filename    text NOT NULL,
    mime_type   text NOT NULL,
    size        bigint NOT NULL CHECK (size >= 0),
    sha256      text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    storage_key text NOT NULL UNIQUE,
    produced_by jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (artifact_id, version)
);
