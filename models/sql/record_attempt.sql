-- record_attempt.sql: records the outcome of a delivery's attempt
-- (WebhookStore.RecordAttempt), only under the claim it was made with (a
-- late attempt never records over a newer claim). The delivery becomes
-- delivered; or pending again, due at once when a resend was asked for
-- meanwhile, else after @retry; or failed, when the next attempt would
-- fall past the retry horizon, or for a test event ('webhook.test', the
-- value of models.EventTest), which is attempted once.
--
-- Parameters (GORM, named):
--   @id uuid: the delivery   @claim timestamptz: the claim (sending_until)
--   @code integer (null: no answer)   @msg text (null: no error)
--   @delivered boolean   @retry bigint: the wait before the next attempt
--   (microseconds)   @horizon bigint: the retry horizon from the event
--   (microseconds)
-- Returns the delivery's new status, or no row (the claim was not its).
UPDATE webhook_deliveries SET attempts = attempts + 1, sending_until = NULL, last_status_code = @code, last_error = @msg,
	status = CASE WHEN resend THEN 'pending'
		WHEN @delivered THEN 'delivered'
		WHEN event_type = 'webhook.test' THEN 'failed'
		WHEN now() + @retry * interval '1 microsecond' > created_at + @horizon * interval '1 microsecond' THEN 'failed'
		ELSE 'pending' END,
	next_attempt_at = CASE WHEN resend THEN now()
		WHEN @delivered THEN NULL
		WHEN event_type = 'webhook.test' THEN NULL
		WHEN now() + @retry * interval '1 microsecond' > created_at + @horizon * interval '1 microsecond' THEN NULL
		ELSE now() + @retry * interval '1 microsecond' END,
	delivered_at = CASE WHEN @delivered AND NOT resend THEN now() END,
	resend = false
WHERE id = @id AND status = 'pending' AND sending_until = @claim
RETURNING status
