-- +goose Up
-- The whole schema of valruns. Constraints follow Brandur Leach's
-- rocket-rides-atomic schema: NOT NULL everywhere a value is required, foreign
-- keys, and CHECKs on lengths so that a bug cannot store nonsense.

CREATE TABLE organizations (
    id                uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    name              text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    slug              text        NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    -- NULL: DEFAULT_MONTHLY_RUN_QUOTA applies; 0: unlimited.
    monthly_run_quota bigint      CHECK (monthly_run_quota >= 0),
    created_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
    id           uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id       uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    -- SHA-256 of the token; the token itself is shown once and never stored.
    token_hash   bytea       NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    -- the first characters of the token, so a person can tell tokens apart.
    display      text        NOT NULL CHECK (char_length(display) BETWEEN 1 AND 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);
CREATE INDEX api_tokens_org_id_idx ON api_tokens (org_id);

CREATE TABLE workflows (
    id         uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id     uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    name       text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    -- JSON Schema the submission must satisfy; NULL: none.
    schema     jsonb,
    -- CEL assertions: [{name, expr, severity, message}].
    assertions jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(assertions) = 'array'),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workflows_org_created_idx ON workflows (org_id, created_at DESC, id DESC);

CREATE TABLE validation_runs (
    id                 uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id             uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    workflow_id        uuid        NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    status             text        NOT NULL DEFAULT 'queued'
                                   CHECK (status IN ('queued', 'running', 'passed', 'failed', 'error')),
    submission         jsonb       NOT NULL,
    metadata           jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    -- the idempotency key that created the run; its foreign key is added below.
    idempotency_key_id uuid,
    -- how many times a worker has started executing the run.
    attempts           integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- while running: until when the worker that took it owns it.
    lease_expires_at   timestamptz,
    error              text        CHECK (char_length(error) <= 2000),
    created_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    finished_at        timestamptz,
    CHECK (status <> 'error' OR error IS NOT NULL),
    CHECK (status NOT IN ('passed', 'failed', 'error') OR finished_at IS NOT NULL)
);
CREATE INDEX validation_runs_org_created_idx ON validation_runs (org_id, created_at DESC, id DESC);
CREATE INDEX validation_runs_workflow_created_idx ON validation_runs (workflow_id, created_at DESC, id DESC);
CREATE INDEX validation_runs_idempotency_key_idx ON validation_runs (idempotency_key_id)
    WHERE idempotency_key_id IS NOT NULL;

CREATE TABLE findings (
    id         bigserial   PRIMARY KEY,
    run_id     uuid        NOT NULL REFERENCES validation_runs (id) ON DELETE CASCADE,
    -- position within the run: with the unique index, findings are written once.
    position   integer     NOT NULL CHECK (position >= 0),
    step       text        NOT NULL CHECK (char_length(step) BETWEEN 1 AND 200),
    severity   text        NOT NULL CHECK (severity IN ('error', 'warning', 'info')),
    path       text        NOT NULL DEFAULT '' CHECK (char_length(path) <= 2000),
    message    text        NOT NULL CHECK (char_length(message) BETWEEN 1 AND 4000),
    UNIQUE (run_id, position)
);

CREATE TABLE usage_counters (
    org_id     uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    -- first day of the calendar month (UTC) counted.
    period     date        NOT NULL CHECK (extract(day FROM period) = 1),
    runs       bigint      NOT NULL DEFAULT 0 CHECK (runs >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, period)
);

CREATE TABLE audit_records (
    id           bigserial   PRIMARY KEY,
    org_id       uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    action       text        NOT NULL CHECK (char_length(action) BETWEEN 1 AND 100),
    subject_type text        NOT NULL CHECK (char_length(subject_type) BETWEEN 1 AND 100),
    subject_id   uuid        NOT NULL,
    token_id     uuid,
    request_id   text        CHECK (char_length(request_id) <= 200),
    data         jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_records_org_created_idx ON audit_records (org_id, created_at DESC);

CREATE TABLE idempotency_keys (
    id                uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id            uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
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
    validation_run_id uuid        REFERENCES validation_runs (id) ON DELETE SET NULL,
    request_id        text        NOT NULL CHECK (char_length(request_id) BETWEEN 1 AND 200),
    client_ip         text        CHECK (char_length(client_ip) <= 100),
    user_agent        text        CHECK (char_length(user_agent) <= 1000),
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL,
    CHECK (expires_at > created_at),
    UNIQUE (org_id, endpoint, key)
);
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

-- Deferred so a request can insert its run (pointing at the key id it chose)
-- before the key row, which is written last with the response, in one
-- transaction and without an extra UPDATE. ON UPDATE SET NULL: when an
-- expired key is taken over, the upsert gives the row a new id, which unlinks
-- the old run from it in the same statement. The cleanup's DELETE unlinks too.
ALTER TABLE validation_runs
    ADD CONSTRAINT validation_runs_idempotency_key_id_fkey
    FOREIGN KEY (idempotency_key_id) REFERENCES idempotency_keys (id)
    ON DELETE SET NULL ON UPDATE SET NULL DEFERRABLE INITIALLY DEFERRED;

-- Brandur's transactionally staged jobs: written in the request transaction,
-- moved to asynq after commit by the enqueuer.
CREATE TABLE staged_jobs (
    id         bigserial   PRIMARY KEY,
    job_name   text        NOT NULL CHECK (char_length(job_name) BETWEEN 1 AND 100),
    job_args   jsonb       NOT NULL,
    -- the asynq TaskID: a crash between enqueue and delete cannot make a second task.
    task_id    text        NOT NULL UNIQUE CHECK (char_length(task_id) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE staged_jobs;
ALTER TABLE validation_runs DROP CONSTRAINT validation_runs_idempotency_key_id_fkey;
DROP TABLE idempotency_keys;
DROP TABLE audit_records;
DROP TABLE usage_counters;
DROP TABLE findings;
DROP TABLE validation_runs;
DROP TABLE workflows;
DROP TABLE api_tokens;
DROP TABLE organizations;
