-- +goose Up
-- Keys partitioned by day of expiry (issue 49): the cleanup drops a day's
-- partition once its whole range has expired, instead of deleting its rows
-- one by one (each a WAL record, an index entry to vacuum, and work beside
-- the starts).
--
-- * One partition per UTC day of expires_at, named idempotency_keys_pYYYYMMDD,
--   made ahead by idempotency_key_partitions (below): at migrate time, at
--   every process's start and at every cleanup. No DEFAULT partition: it
--   would forbid DETACH ... CONCURRENTLY, the detach that never blocks a
--   start (docs/operations.md).
-- * The primary key must hold the partition column: (org_id, endpoint, key,
--   expires_at). One live row per scoped key rests on the key's advisory
--   lock, which every write of a key holds, and on the writer's look at the
--   key's newest row after taking it (docs/design.md). An expired row is
--   never taken over: the key's next request inserts a row of its own, and
--   the old one goes with its partition.
-- * No index on expires_at: the partitions are the index.
-- * No foreign key from validation_run_id to validation_runs: a partition
--   holding one could be neither detached nor dropped without a lock on
--   validation_runs that every start waits behind (docs/design.md). valruns
--   deletes no run; the link is kept by value, as the run names its key.
--
-- The live rows are copied in this transaction, which holds ACCESS
-- EXCLUSIVE on the old table until it commits: starts with a key wait
-- meanwhile (docs/operations.md, Upgrading to partitioned keys).
ALTER TABLE idempotency_keys RENAME TO idempotency_keys_unpartitioned;
ALTER INDEX idempotency_keys_pkey RENAME TO idempotency_keys_unpartitioned_pkey;
ALTER INDEX idempotency_keys_expires_at_idx RENAME TO idempotency_keys_unpartitioned_expires_at_idx;

CREATE TABLE idempotency_keys (
    org_id            uuid        NOT NULL,
    -- the endpoint scope, such as workflow_start.
    endpoint          text        NOT NULL CHECK (char_length(endpoint) BETWEEN 1 AND 100),
    key               text        NOT NULL CHECK (char_length(key) BETWEEN 1 AND 255),
    -- SHA-256 over method, path and canonical body.
    request_hash      bytea       NOT NULL CHECK (octet_length(request_hash) = 32),
    request_method    text        NOT NULL CHECK (char_length(request_method) BETWEEN 1 AND 10),
    request_path      text        NOT NULL CHECK (char_length(request_path) BETWEEN 1 AND 2000),
    response_status   integer     NOT NULL CHECK (response_status BETWEEN 200 AND 499),
    -- the exact bytes answered (jsonb would reorder keys).
    response_body     bytea       NOT NULL,
    -- the allowlisted headers answered: {"Content-Type": "...", "Location": "..."}.
    response_headers  jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(response_headers) = 'object'),
    -- the run the request created (no foreign key: see above).
    validation_run_id uuid,
    request_id        text        NOT NULL CHECK (char_length(request_id) BETWEEN 1 AND 200),
    client_ip         text        CHECK (char_length(client_ip) <= 100),
    user_agent        text        CHECK (char_length(user_agent) <= 1000),
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL,
    CHECK (expires_at > created_at),
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (org_id, endpoint, key, expires_at)
) PARTITION BY RANGE (expires_at);

-- idempotency_key_partitions makes the missing partitions of the UTC days
-- from first's through last's, and returns how many it made. Each is made
-- empty, then attached: ATTACH takes SHARE UPDATE EXCLUSIVE on the parent,
-- which no start's lock conflicts with (CREATE TABLE ... PARTITION OF would
-- take ACCESS EXCLUSIVE). Callers are serialised by an advisory lock of
-- their own (the two-integer form: no key's lock is one of those).
-- +goose StatementBegin
CREATE FUNCTION idempotency_key_partitions(first timestamptz, last timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    day  date := CAST(first AT TIME ZONE 'UTC' AS date);
    made integer := 0;
    name text;
BEGIN
    PERFORM pg_advisory_xact_lock(49, 1);
    WHILE day <= CAST(last AT TIME ZONE 'UTC' AS date) LOOP
        name := 'idempotency_keys_p' || to_char(day, 'YYYYMMDD');
        IF NOT EXISTS (SELECT 1 FROM pg_class WHERE relname = name AND relnamespace = to_regnamespace(current_schema())) THEN
            EXECUTE format('CREATE TABLE %I (LIKE idempotency_keys INCLUDING ALL)', name);
            EXECUTE format('ALTER TABLE idempotency_keys ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', name,
                to_char(day, 'YYYY-MM-DD') || ' 00:00:00+00', to_char(day + 1, 'YYYY-MM-DD') || ' 00:00:00+00');
            made := made + 1;
        END IF;
        day := day + 1;
    END LOOP;
    RETURN made;
END $$;
-- +goose StatementEnd

-- Today through the third day ahead (the default IDEMPOTENCY_TTL and two
-- days' margin), and every day a live row expires in.
SELECT idempotency_key_partitions(now(), greatest(now() + interval '3 days',
    (SELECT max(expires_at) FROM idempotency_keys_unpartitioned)));
INSERT INTO idempotency_keys (org_id, endpoint, key, request_hash, request_method, request_path, response_status,
    response_body, response_headers, validation_run_id, request_id, client_ip, user_agent, created_at, expires_at)
SELECT org_id, endpoint, key, request_hash, request_method, request_path, response_status,
    response_body, response_headers, validation_run_id, request_id, client_ip, user_agent, created_at, expires_at
FROM idempotency_keys_unpartitioned WHERE expires_at > now();
DROP TABLE idempotency_keys_unpartitioned;

-- +goose Down
-- Back to one table: the newest live row of each key (there is at most
-- one), with its link to its run where the run exists.
CREATE TABLE idempotency_keys_unpartitioned (
    org_id            uuid        NOT NULL,
    endpoint          text        NOT NULL CHECK (char_length(endpoint) BETWEEN 1 AND 100),
    key               text        NOT NULL CHECK (char_length(key) BETWEEN 1 AND 255),
    request_hash      bytea       NOT NULL CHECK (octet_length(request_hash) = 32),
    request_method    text        NOT NULL CHECK (char_length(request_method) BETWEEN 1 AND 10),
    request_path      text        NOT NULL CHECK (char_length(request_path) BETWEEN 1 AND 2000),
    response_status   integer     NOT NULL CHECK (response_status BETWEEN 200 AND 499),
    response_body     bytea       NOT NULL,
    response_headers  jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(response_headers) = 'object'),
    validation_run_id uuid        CONSTRAINT idempotency_keys_validation_run_id_fkey
                                  REFERENCES validation_runs (id) ON DELETE SET NULL,
    request_id        text        NOT NULL CHECK (char_length(request_id) BETWEEN 1 AND 200),
    client_ip         text        CHECK (char_length(client_ip) <= 100),
    user_agent        text        CHECK (char_length(user_agent) <= 1000),
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL,
    CHECK (expires_at > created_at)
);
INSERT INTO idempotency_keys_unpartitioned
SELECT DISTINCT ON (k.org_id, k.endpoint, k.key) k.org_id, k.endpoint, k.key, k.request_hash, k.request_method,
    k.request_path, k.response_status, k.response_body, k.response_headers, r.id, k.request_id, k.client_ip,
    k.user_agent, k.created_at, k.expires_at
FROM idempotency_keys k LEFT JOIN validation_runs r ON r.id = k.validation_run_id
WHERE k.expires_at > now()
ORDER BY k.org_id, k.endpoint, k.key, k.expires_at DESC;
DROP TABLE idempotency_keys; -- with its partitions
DROP FUNCTION idempotency_key_partitions(timestamptz, timestamptz);
-- Detached partitions a cleanup left behind (it drops them next).
-- +goose StatementBegin
DO $$
DECLARE t text;
BEGIN
    FOR t IN SELECT relname FROM pg_class
        WHERE relkind = 'r' AND relnamespace = to_regnamespace(current_schema())
          AND relname ~ '^idempotency_keys_p[0-9]{8}$' LOOP
        EXECUTE format('DROP TABLE %I', t);
    END LOOP;
END $$;
-- +goose StatementEnd
ALTER TABLE idempotency_keys_unpartitioned RENAME TO idempotency_keys;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (org_id, endpoint, key);
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
