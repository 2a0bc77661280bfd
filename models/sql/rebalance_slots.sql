-- rebalance_slots.sql: rewrites an organisation's usage slots of a period
-- for a quota (rebalance): the runs counted so far are laid into the slots
-- in order, each up to its cap (quota / slots, the remainder spread over
-- the first slots). Past the quota the excess stays in slot 0, so every
-- slot is full. Unlimited (quota 0): all in slot 0.
--
-- Parameters (GORM, named):
--   @org uuid   @period date   @quota bigint (0: none)
--   @total bigint: the runs counted so far (lock_usage_slots.sql)
--   @slots integer: the slots per organisation and period (UsageSlots)
INSERT INTO usage_slots (org_id, period, slot, runs, quota, cap)
SELECT @org, @period, g,
	CASE WHEN q = 0 THEN CASE WHEN g = 0 THEN total ELSE 0 END
	     ELSE least(cap, greatest(0, total - before)) + CASE WHEN g = 0 THEN greatest(0, total - q) ELSE 0 END
	END,
	q, cap
FROM (
	SELECT g, q, total,
		CASE WHEN q = 0 THEN 0 ELSE q / n + CASE WHEN g < q % n THEN 1 ELSE 0 END END AS cap,
		CASE WHEN q = 0 THEN 0 ELSE g * (q / n) + least(g, q % n) END AS before
	FROM (SELECT CAST(@quota AS bigint) AS q, CAST(@total AS bigint) AS total, CAST(@slots AS bigint) AS n) params,
		generate_series(0, CAST(@slots AS integer) - 1) AS g
) shares
ON CONFLICT (org_id, period, slot) DO UPDATE SET runs = EXCLUDED.runs, quota = EXCLUDED.quota, cap = EXCLUDED.cap
