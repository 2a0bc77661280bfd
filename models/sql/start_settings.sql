-- start_settings.sql: the first statement of every batch of starts
-- (models.batchWrite.send): the batch's statement_timeout and
-- client_connection_check_interval, and a generic plan for the statements
-- after it (start_locks.sql, start_batch.sql), all local to the batch's
-- implicit transaction. Why the generic plan: see startSettingsSQL.
--
-- Parameters:
--   $1 statement_timeout (ms, text)   $2 client_connection_check_interval (ms, text)
SELECT set_config('statement_timeout', $1, true), set_config('client_connection_check_interval', $2, true),
	set_config('plan_cache_mode', 'force_generic_plan', true)
