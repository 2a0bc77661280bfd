-- +goose Up
-- +goose NO TRANSACTION
-- Less work per start (issue 15): what each start wrote that no query needs.
--
-- * No foreign keys from the hot tables to organizations and workflows. Each
--   check locked the referenced row (FOR KEY SHARE: a WAL record per
--   statement, and a MultiXact as soon as two starts of one organisation
--   overlapped), on rows every start of an organisation shares. valruns
--   deletes neither organisations nor workflows, and the start checks in
--   its own statement that the workflow is the organisation's. Whoever
--   deletes an organisation by hand deletes its runs and keys first (the
--   README says how). The key's link to its run keeps its foreign key
--   (ON DELETE SET NULL), and every other table keeps its own.
-- * The runs' list indexes ascend: a new run lands at the right edge of its
--   organisation's and its workflow's range, where a full page splits
--   90/10, instead of the left edge, where it splits 50/50. The lists walk
--   them backwards (newest first) at the same cost.
--
-- Outside a transaction, so that the indexes build CONCURRENTLY: a large
-- table keeps taking starts meanwhile. Each statement may be run again.
ALTER TABLE validation_runs DROP CONSTRAINT IF EXISTS validation_runs_org_id_fkey;
ALTER TABLE validation_runs DROP CONSTRAINT IF EXISTS validation_runs_workflow_id_fkey;
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_org_id_fkey;
CREATE INDEX CONCURRENTLY IF NOT EXISTS validation_runs_org_recent_idx ON validation_runs (org_id, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS validation_runs_org_created_idx;
CREATE INDEX CONCURRENTLY IF NOT EXISTS validation_runs_workflow_recent_idx ON validation_runs (workflow_id, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS validation_runs_workflow_created_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS validation_runs_workflow_created_idx ON validation_runs (workflow_id, created_at DESC, id DESC);
DROP INDEX CONCURRENTLY IF EXISTS validation_runs_workflow_recent_idx;
CREATE INDEX CONCURRENTLY IF NOT EXISTS validation_runs_org_created_idx ON validation_runs (org_id, created_at DESC, id DESC);
DROP INDEX CONCURRENTLY IF EXISTS validation_runs_org_recent_idx;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_org_id_fkey
    FOREIGN KEY (org_id) REFERENCES organizations (id) ON DELETE CASCADE;
ALTER TABLE validation_runs ADD CONSTRAINT validation_runs_workflow_id_fkey
    FOREIGN KEY (workflow_id) REFERENCES workflows (id) ON DELETE CASCADE;
ALTER TABLE validation_runs ADD CONSTRAINT validation_runs_org_id_fkey
    FOREIGN KEY (org_id) REFERENCES organizations (id) ON DELETE CASCADE;
