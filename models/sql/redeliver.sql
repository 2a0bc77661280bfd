-- redeliver.sql: makes a delivery pending and due now (WebhookStore.Redeliver),
-- whatever its status; when an attempt of it is under way (a live claim),
-- resend is set instead of a second attempt, so the event is never sent
-- twice at once.
--
-- Parameters (GORM):
--   ?1 delivery uuid   ?2 endpoint uuid   ?3 org uuid
-- Returns the delivery's row, or no row (not the endpoint's or the
-- organisation's).
UPDATE webhook_deliveries SET status = 'pending', delivered_at = NULL, next_attempt_at = now(),
	resend = coalesce(sending_until > now(), false)
WHERE id = ? AND endpoint_id = ? AND org_id = ?
RETURNING *
