-- mark_redelivered.sql: counts a redelivery of a run, once
-- (RunStore.MarkRedelivered): only while it still has the count the sweep
-- read, and never waiting for a row another statement holds (SKIP LOCKED).
-- No row changed: another sweep counted it, or the row was busy.
--
-- Parameters (GORM):
--   ?1 run uuid   ?2 integer: the redeliveries the sweep read
UPDATE validation_runs SET redeliveries = redeliveries + 1
WHERE id = (SELECT id FROM validation_runs WHERE id = ? AND redeliveries = ? FOR UPDATE SKIP LOCKED)
