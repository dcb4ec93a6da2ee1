-- A service key that may act for its platform's end users (SPEC §10.4):
-- with On-Behalf-Of: <id>, a request belongs to the user "<key's user>:<id>".
ALTER TABLE api_keys ADD COLUMN on_behalf boolean NOT NULL DEFAULT false;
