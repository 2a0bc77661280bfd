-- claim_slot_waiting.sql: the slow path's claim of a usage slot
-- (claimSlotWaiting): bumps the first slot with room, waiting for it if
-- another transaction holds it; a slot that turns out full once its holder
-- commits is passed over (PostgreSQL re-checks the condition on the newest
-- version). No row changed: every slot is full.
--
-- Parameters (GORM, named):
--   @org uuid   @period date   @quota bigint (0: none)
UPDATE usage_slots u SET runs = u.runs + 1
WHERE (u.org_id, u.period, u.slot) = (
	SELECT org_id, period, slot FROM usage_slots
	WHERE org_id = @org AND period = @period AND quota = CAST(@quota AS bigint)
	  AND (CAST(@quota AS bigint) = 0 OR runs < cap)
	ORDER BY slot LIMIT 1 FOR UPDATE)
