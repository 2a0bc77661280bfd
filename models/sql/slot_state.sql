-- slot_state.sql: counts an organisation's usage slots of a period
-- balanced for a quota, and those of them with room (slotState), as of the
-- statement's snapshot.
--
-- Parameters (GORM, named):
--   @org uuid   @period date   @quota bigint (0: none)
SELECT count(*) FILTER (WHERE quota = @quota) AS balanced,
	count(*) FILTER (WHERE quota = @quota AND (CAST(@quota AS bigint) = 0 OR runs < cap)) AS open
FROM usage_slots WHERE org_id = @org AND period = @period
