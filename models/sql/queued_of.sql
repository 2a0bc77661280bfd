-- queued_of.sql: those of a set of runs that are queued (RunStore.QueuedOf),
-- in id order.
--
-- Parameters (GORM):
--   ?1 text: the run ids (UUIDs), comma-separated (one parameter whatever
--      their number; GORM would expand a slice into a list)
SELECT id, org_id, status, redeliveries, created_at FROM validation_runs
WHERE id IN (SELECT CAST(x AS uuid) FROM unnest(string_to_array(?, ',')) AS x) AND status = 'queued'
ORDER BY id
