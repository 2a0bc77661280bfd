-- +goose Up
-- Sending the webhook outbox (issue 19). A worker claims due deliveries
-- (pending, next_attempt_at passed) by setting sending_until: while it lies
-- ahead, an attempt is under way and no other worker claims the delivery;
-- once it passes (the worker died mid-attempt, Redis lost the attempt's
-- task), the delivery is due again. Each attempt's outcome clears it.
ALTER TABLE webhook_deliveries ADD COLUMN sending_until timestamptz;

-- The claim picks, per endpoint, its oldest due deliveries, and counts the
-- attempts under way per endpoint (a slow endpoint holds at most a few of
-- the senders); the metrics ask for the oldest pending delivery.
CREATE INDEX webhook_deliveries_endpoint_due_idx ON webhook_deliveries (endpoint_id, next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_pending_created_idx ON webhook_deliveries (created_at) WHERE status = 'pending';
-- The cleanup deletes deliveries done (delivered or failed) past their
-- retention, oldest first.
CREATE INDEX webhook_deliveries_done_created_idx ON webhook_deliveries (created_at) WHERE status <> 'pending';

-- +goose Down
DROP INDEX webhook_deliveries_done_created_idx;
DROP INDEX webhook_deliveries_pending_created_idx;
DROP INDEX webhook_deliveries_endpoint_due_idx;
ALTER TABLE webhook_deliveries DROP COLUMN sending_until;
