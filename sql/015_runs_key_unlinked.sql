-- A run's api_key_id names the key that submitted it, without a foreign
-- key: the check of one locked the key's row (FOR KEY SHARE) in every run's
-- insert, so a key's concurrent runs shared one row's lock (a MultiXact per
-- overlap) and the insert cost a third more. A deleted key's runs keep its
-- id (no key can have it again: a random uuid), which nothing joins: the
-- submitter's check of an approval compares it with the deciding key's.
-- Deleting a key no longer scans runs for its id.
DO $$
DECLARE c name;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'runs'::regclass AND confrelid = 'api_keys'::regclass
               AND contype = 'f' LOOP
        EXECUTE format('ALTER TABLE runs DROP CONSTRAINT %I', c);
    END LOOP;
END $$;
