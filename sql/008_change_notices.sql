-- Every process learns at once what another changed that its caches and
-- the web server's revocation list depend on: a notice on channel
-- codexec_changes, sent at COMMIT. Payload "key <uuid>" when a key is
-- revoked or removed, "artifact <uuid>" when an artifact is deleted or
-- gets a new current version. Ids only, never user content.
CREATE FUNCTION codexec_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('codexec_changes',
                      TG_ARGV[0] || ' ' || (CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END)::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER api_keys_changed AFTER UPDATE OF revoked_at OR DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION codexec_notify_change('key');
CREATE TRIGGER artifacts_changed AFTER UPDATE OF deleted_at, current_version OR DELETE ON artifacts
    FOR EACH ROW EXECUTE FUNCTION codexec_notify_change('artifact');
-- The revocation list: keys revoked lately (links live link_max_expiry).
CREATE INDEX api_keys_revoked ON api_keys (revoked_at) WHERE revoked_at IS NOT NULL;
