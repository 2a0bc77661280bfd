-- start_tx_fast.sql: a start in a transaction (RunStore.Start) in one
-- statement: claims a usage slot without waiting and inserts the run,
-- listed as unfinished (migration 0010). The slot is the first, from a
-- given offset, that no other transaction holds (SKIP LOCKED), balanced for
-- the quota, with room. No row when the workflow is not the organisation's
-- (nothing is billed then), when the slots are not balanced for the quota
-- (a new month, a changed quota), when the quota is used up, or when every
-- slot with room is held: the caller then takes the slow path (claimSlot).
--
-- Parameters:
--   $1 workflow uuid   $2 org uuid   $3 period date   $4 quota bigint (0: none)
--   $5 integer: the slot to start looking from   $6 integer: UsageSlots
--   $7 id uuid   $8 submission text (JSON)   $9 metadata text (JSON object)
--   $10 created_at timestamptz   $11 token uuid (null: none)
--   $12 request_id text   $13 key text (null: no key)
-- Returns the run's id, or no row.
WITH wf AS (
	SELECT id FROM workflows WHERE id = $1 AND org_id = $2
), slot AS (
	SELECT s.slot FROM usage_slots s
	WHERE s.org_id = $2 AND s.period = $3 AND s.quota = CAST($4 AS bigint)
	  AND (CAST($4 AS bigint) = 0 OR s.runs < s.cap)
	  AND EXISTS (SELECT 1 FROM wf)
	ORDER BY (s.slot + CAST($5 AS integer)) % CAST($6 AS integer)
	LIMIT 1 FOR UPDATE SKIP LOCKED
), bump AS (
	UPDATE usage_slots u SET runs = u.runs + 1 FROM slot
	WHERE u.org_id = $2 AND u.period = $3 AND u.slot = slot.slot
	RETURNING u.slot
), run AS (
	INSERT INTO validation_runs (id, org_id, workflow_id, status, submission, metadata, created_at,
		token_id, request_id, idempotency_key)
	SELECT $7, $2, $1, 'queued', CAST($8 AS json), CAST($9 AS json), $10, $11, $12, $13 FROM bump
	RETURNING id
), listed AS (
	INSERT INTO unfinished_runs (id) SELECT id FROM run
) SELECT id FROM run
