-- claim_due_deliveries.sql: claims pending deliveries that are due and that
-- no attempt is under way for, for a lease (WebhookStore.ClaimDueDeliveries).
-- Fair by endpoint: the oldest due deliveries of each endpoint in turn,
-- and at most @per attempts of one endpoint under way at once, counting
-- those already under way. SKIP LOCKED: never waits for another claimer.
--
-- Parameters (GORM, named):
--   @limit integer: the most deliveries (and endpoints)
--   @per integer: the most attempts of one endpoint under way at once
--   @lease bigint: the claim's lease (microseconds)
-- Returns each claimed delivery's id, attempts and claim (its sending_until).
WITH eps AS (
	SELECT endpoint_id, min(next_attempt_at) AS first FROM webhook_deliveries
	WHERE status = 'pending' AND next_attempt_at <= now() AND (sending_until IS NULL OR sending_until <= now())
	GROUP BY endpoint_id ORDER BY first LIMIT @limit),
busy AS (
	SELECT e.endpoint_id, e.first, (SELECT count(*) FROM webhook_deliveries b
		WHERE b.endpoint_id = e.endpoint_id AND b.status = 'pending' AND b.sending_until > now()) AS n
	FROM eps e),
pick AS (
	SELECT c.id, row_number() OVER (PARTITION BY b.endpoint_id ORDER BY c.next_attempt_at) AS turn, b.first
	FROM busy b CROSS JOIN LATERAL (
		SELECT d.id, d.next_attempt_at FROM webhook_deliveries d
		WHERE d.endpoint_id = b.endpoint_id AND d.status = 'pending' AND d.next_attempt_at <= now()
			AND (d.sending_until IS NULL OR d.sending_until <= now())
		ORDER BY d.next_attempt_at LIMIT greatest(@per - b.n, 0)
		FOR UPDATE SKIP LOCKED) c
	ORDER BY turn, first LIMIT @limit)
UPDATE webhook_deliveries d SET sending_until = now() + @lease * interval '1 microsecond', resend = false
FROM pick WHERE d.id = pick.id
RETURNING d.id, d.attempts, d.sending_until AS claim
