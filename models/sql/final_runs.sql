-- final_runs.sql: those of a set of runs that are final (RunStore.Finished).
--
-- Parameters (GORM):
--   ?1 text: the run ids, comma-separated (one parameter whatever their
--      number; GORM would expand a slice into a list)
--   ?2, ?3, ?4 text: the final statuses (passed, failed, error)
SELECT id FROM validation_runs
WHERE id = ANY(CAST(string_to_array(?, ',') AS uuid[])) AND status IN (?, ?, ?)
