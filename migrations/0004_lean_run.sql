-- +goose Up
-- The lean run: the same promises with less PostgreSQL work per run.
--
-- * A run's findings are a json column of the run, written by the statement
--   that finishes it, not one row (and one index entry) per finding.
-- * The audit trail is a view over the runs: each run row carries who
--   started it (token, request id) and with which key, so a start writes no
--   audit row of its own.
-- * No staged job: the API hands a committed run to the queue itself, and
--   the sweeper re-enqueues any run that a crash or Redis lost (the run row
--   is the outbox; its partial index finds the unfinished ones).
-- * Keys are found by their scoped key only: no surrogate id (its index
--   and default), the scoped key is the primary key; a run names its key
--   by value, the key its run by id (ON DELETE SET NULL, as before).
-- * Submissions and metadata are stored as json (the text as validated),
--   not parsed into jsonb on every insert.

-- Checks of the deferred foreign key that the statements below fire must not
-- wait for the commit: the table is altered after them.
SET CONSTRAINTS ALL IMMEDIATE;

ALTER TABLE validation_runs ADD COLUMN findings json;
UPDATE validation_runs r SET findings = coalesce((
	SELECT json_agg(json_build_object('step', f.step, 'severity', f.severity, 'path', f.path, 'message', f.message)
	                ORDER BY f.position)
	FROM findings f WHERE f.run_id = r.id), '[]')
WHERE r.finished_at IS NOT NULL;
DROP TABLE findings;

ALTER TABLE validation_runs ADD COLUMN token_id uuid;
ALTER TABLE validation_runs ADD COLUMN request_id text CHECK (char_length(request_id) <= 200);
ALTER TABLE validation_runs ADD COLUMN idempotency_key text CHECK (char_length(idempotency_key) BETWEEN 1 AND 255);
UPDATE validation_runs r SET token_id = a.token_id, request_id = a.request_id
FROM audit_records a WHERE a.subject_type = 'validation_run' AND a.subject_id = r.id;
UPDATE validation_runs r SET idempotency_key = k.key
FROM idempotency_keys k WHERE k.id = r.idempotency_key_id;

DROP TABLE audit_records;
CREATE VIEW audit_records AS
SELECT r.org_id, 'validation_run.start' AS action, 'validation_run' AS subject_type, r.id AS subject_id,
	r.token_id, r.request_id,
	json_build_object('workflow_id', r.workflow_id, 'idempotency_key', r.idempotency_key) AS data,
	r.created_at
FROM validation_runs r;

DROP TABLE staged_jobs;

ALTER TABLE validation_runs DROP COLUMN idempotency_key_id; -- with its index and foreign key
ALTER TABLE idempotency_keys DROP COLUMN id;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_org_id_endpoint_key_key;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (org_id, endpoint, key);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idempotency_key_taken() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'idempotency key already finished by another request'
        USING ERRCODE = 'unique_violation', CONSTRAINT = 'idempotency_keys_pkey';
END $$;
-- +goose StatementEnd

ALTER TABLE validation_runs ALTER COLUMN submission TYPE json USING submission::json;
ALTER TABLE validation_runs ALTER COLUMN metadata DROP DEFAULT;
ALTER TABLE validation_runs DROP CONSTRAINT validation_runs_metadata_check;
ALTER TABLE validation_runs ALTER COLUMN metadata TYPE json USING metadata::json;
ALTER TABLE validation_runs ALTER COLUMN metadata SET DEFAULT '{}';
ALTER TABLE validation_runs ADD CONSTRAINT validation_runs_metadata_check CHECK (json_typeof(metadata) = 'object');

-- The sweeper pages through the unfinished runs by (status, created_at, id).
DROP INDEX validation_runs_unfinished_idx;
CREATE INDEX validation_runs_unfinished_idx ON validation_runs (status, created_at, id)
	WHERE status IN ('queued', 'running');
ALTER TABLE validation_runs DROP COLUMN swept_at;

-- +goose Down
ALTER TABLE validation_runs ADD COLUMN swept_at timestamptz;
ALTER TABLE validation_runs DROP CONSTRAINT validation_runs_metadata_check;
DROP INDEX validation_runs_unfinished_idx;
CREATE INDEX validation_runs_unfinished_idx ON validation_runs (created_at)
	WHERE status IN ('queued', 'running');

ALTER TABLE validation_runs ALTER COLUMN metadata DROP DEFAULT;
ALTER TABLE validation_runs ALTER COLUMN metadata TYPE jsonb USING metadata::jsonb;
ALTER TABLE validation_runs ALTER COLUMN metadata SET DEFAULT '{}';
ALTER TABLE validation_runs ADD CONSTRAINT validation_runs_metadata_check CHECK (jsonb_typeof(metadata) = 'object');
ALTER TABLE validation_runs ALTER COLUMN submission TYPE jsonb USING submission::jsonb;

ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_org_id_endpoint_key_key UNIQUE (org_id, endpoint, key);
ALTER TABLE idempotency_keys ADD COLUMN id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY;
ALTER TABLE idempotency_keys ALTER COLUMN id DROP DEFAULT;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION idempotency_key_taken() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'idempotency key already finished by another request'
        USING ERRCODE = 'unique_violation', CONSTRAINT = 'idempotency_keys_org_id_endpoint_key_key';
END $$;
-- +goose StatementEnd

ALTER TABLE validation_runs ADD COLUMN idempotency_key_id uuid;
UPDATE validation_runs r SET idempotency_key_id = k.id
FROM idempotency_keys k WHERE k.validation_run_id = r.id;
ALTER TABLE validation_runs
    ADD CONSTRAINT validation_runs_idempotency_key_id_fkey
    FOREIGN KEY (idempotency_key_id) REFERENCES idempotency_keys (id)
    ON DELETE SET NULL ON UPDATE SET NULL DEFERRABLE INITIALLY DEFERRED;
CREATE INDEX validation_runs_idempotency_key_idx ON validation_runs (idempotency_key_id)
    WHERE idempotency_key_id IS NOT NULL;

CREATE TABLE staged_jobs (
    id         bigserial   PRIMARY KEY,
    job_name   text        NOT NULL CHECK (char_length(job_name) BETWEEN 1 AND 100),
    job_args   jsonb       NOT NULL,
    task_id    text        NOT NULL UNIQUE CHECK (char_length(task_id) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now()
);
-- Runs not final get their job back, so the enqueuer delivers them.
INSERT INTO staged_jobs (job_name, job_args, task_id)
SELECT 'validation_run:execute', jsonb_build_object('run_id', id), 'validation_run:' || id
FROM validation_runs WHERE status IN ('queued', 'running');

DROP VIEW audit_records;
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
INSERT INTO audit_records (org_id, action, subject_type, subject_id, token_id, request_id, data, created_at)
SELECT org_id, 'validation_run.start', 'validation_run', id, token_id, request_id,
	jsonb_build_object('workflow_id', workflow_id, 'idempotency_key_id', idempotency_key_id), created_at
FROM validation_runs;
ALTER TABLE validation_runs DROP COLUMN idempotency_key;
ALTER TABLE validation_runs DROP COLUMN request_id;
ALTER TABLE validation_runs DROP COLUMN token_id;

CREATE TABLE findings (
    id         bigserial   PRIMARY KEY,
    run_id     uuid        NOT NULL REFERENCES validation_runs (id) ON DELETE CASCADE,
    position   integer     NOT NULL CHECK (position >= 0),
    step       text        NOT NULL CHECK (char_length(step) BETWEEN 1 AND 200),
    severity   text        NOT NULL CHECK (severity IN ('error', 'warning', 'info')),
    path       text        NOT NULL DEFAULT '' CHECK (char_length(path) <= 2000),
    message    text        NOT NULL CHECK (char_length(message) BETWEEN 1 AND 4000),
    UNIQUE (run_id, position)
);
INSERT INTO findings (run_id, position, step, severity, path, message)
SELECT r.id, f.ord - 1, f.v->>'step', f.v->>'severity', coalesce(f.v->>'path', ''), f.v->>'message'
FROM validation_runs r, json_array_elements(r.findings) WITH ORDINALITY AS f(v, ord)
WHERE r.findings IS NOT NULL;
ALTER TABLE validation_runs DROP COLUMN findings;
