-- delete_done_deliveries.sql: deletes a batch of deliveries delivered or
-- failed whose event is older than a time (WebhookStore.DeleteDoneDeliveries),
-- by the rows' places (ctid), SKIP LOCKED. Pending ones are kept, however old.
--
-- Parameters (GORM):
--   ?1 timestamptz: events before it   ?2 integer: the most deliveries
DELETE FROM webhook_deliveries WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM webhook_deliveries WHERE status <> 'pending' AND created_at < ?
	ORDER BY created_at LIMIT ? FOR UPDATE SKIP LOCKED))
