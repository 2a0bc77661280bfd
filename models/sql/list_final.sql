-- list_final.sql: a page of the organisation's runs of one final status
-- (RunStore.listFinal): walks at most the scan budget of its newest runs
-- (the GORM query ?3, in created_at, id order) and keeps those of the
-- status, and the last run walked (edge), where the next page resumes.
--
-- Parameters (GORM):
--   ?1 status text   ?2 integer: the scan budget (FinalScanBudget)
--   ?3 the scan, a GORM query (a subquery)   ?4 integer: the page's limit + 1
SELECT * FROM (
	SELECT r.*, r.status = ? AS hit, row_number() OVER (ORDER BY r.created_at DESC, r.id DESC) = ? AS edge FROM (?) r
) x WHERE hit OR edge ORDER BY created_at DESC, id DESC LIMIT ?
