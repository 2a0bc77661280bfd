-- +goose Up
-- The worker's sweeper (tasks/sweeper.go) re-enqueues runs that are not
-- final and that nothing will deliver again: queued runs whose task Redis
-- lost, running runs whose worker died (their lease ran out). An accepted
-- run stays re-deliverable until it is final.

-- How many times the sweeper re-enqueued the run. The n-th redelivery has
-- the asynq TaskID validation_run:<id>:redeliver:<n>: a new ID each time,
-- because a completed task keeps its ID for its retention period.
ALTER TABLE validation_runs ADD COLUMN redeliveries integer NOT NULL DEFAULT 0 CHECK (redeliveries >= 0);
-- When a sweeper last looked at the run; it looks again only after
-- RUN_REDELIVER_AFTER, so several workers' sweeps cost one check per run.
ALTER TABLE validation_runs ADD COLUMN swept_at timestamptz;
-- The sweep reads only the runs that are not final: few, on a big table.
CREATE INDEX validation_runs_unfinished_idx ON validation_runs (created_at)
    WHERE status IN ('queued', 'running');

-- +goose Down
DROP INDEX validation_runs_unfinished_idx;
ALTER TABLE validation_runs DROP COLUMN swept_at;
ALTER TABLE validation_runs DROP COLUMN redeliveries;
