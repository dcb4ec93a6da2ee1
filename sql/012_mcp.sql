-- MCP sessions (SPEC §10.6): one per initialize on /mcp, bound to the
-- user and the key that made it (key_id '' when the web server
-- authenticated), working in the conversation 'mcp-' || id unless a tool
-- call names another. expires_at moves on at every use (default_ttl);
-- DELETE /mcp ends it. At most a thousand live per user: the least
-- recently used beyond that is ended by the next initialize; at most ten
-- thousand a key (On-Behalf-Of makes a user of every id a service names).
CREATE TABLE mcp_sessions (
    id               text PRIMARY KEY,
    user_id          text NOT NULL,
    key_id           text NOT NULL,
    protocol_version text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL
);
CREATE INDEX mcp_sessions_user ON mcp_sessions (user_id, expires_at);
CREATE INDEX mcp_sessions_key ON mcp_sessions (key_id, expires_at);
CREATE INDEX mcp_sessions_expiry ON mcp_sessions (expires_at);

-- A run_code call in progress, so notifications/cancelled (which names
-- the call's JSON-RPC id) finds its run in whichever process runs it.
-- Made when the call starts and removed when it ends: bounded by the
-- calls in progress, which the run lane bounds.
CREATE TABLE mcp_calls (
    session_id text NOT NULL REFERENCES mcp_sessions (id) ON DELETE CASCADE,
    request_id text NOT NULL,
    run_id     uuid,
    cancelled  boolean NOT NULL DEFAULT false,
    PRIMARY KEY (session_id, request_id)
);
