-- usage_of_period.sql: an organisation's runs started in a period, and its
-- own monthly quota (UsageStore.Get). No row: no such organisation.
--
-- Parameters (GORM):
--   ?1 period date   ?2 org uuid
SELECT coalesce((SELECT sum(runs) FROM usage_slots WHERE org_id = o.id AND period = ?), 0) AS runs,
	o.monthly_run_quota AS quota
FROM organizations o WHERE o.id = ?
