-- lock_usage_slots.sql: locks every usage slot of an organisation and
-- period, in slot order, and sums their runs (rebalance, before it
-- rewrites them: no run is in flight then).
--
-- Parameters (GORM):
--   ?1 org uuid   ?2 period date
SELECT coalesce(sum(runs), 0) FROM (
	SELECT runs FROM usage_slots WHERE org_id = ? AND period = ? ORDER BY slot FOR UPDATE) s
