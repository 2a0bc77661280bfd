-- start_slow.sql: the slow path's insert of a run (RunStore.Start), once
-- its slot has been claimed: the run, queued, listed as unfinished (where
-- the sweeper looks for it, migration 0010).
--
-- Parameters:
--   $1 org uuid   $2 workflow uuid   $3 id uuid
--   $4 submission text (JSON)   $5 metadata text (JSON object)
--   $6 created_at timestamptz   $7 token uuid (null: none)
--   $8 request_id text          $9 key text (null: no key)
-- Returns the run's id.
WITH run AS (
	INSERT INTO validation_runs (id, org_id, workflow_id, status, submission, metadata, created_at,
		token_id, request_id, idempotency_key)
	VALUES ($3, $1, $2, 'queued', CAST($4 AS json), CAST($5 AS json), $6, $7, $8, $9)
	RETURNING id
), listed AS (
	INSERT INTO unfinished_runs (id) SELECT id FROM run
) SELECT id FROM run
