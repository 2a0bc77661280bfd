-- +goose Up
-- What support needs (issue 31): a delivery sent again on request, and a
-- test event to an endpoint.
--
-- * A test event (webhook.test) is about no run: its delivery has no
--   run_id. Every other delivery still names its run.
-- * resend: a redelivery was asked while an attempt of the delivery was
--   under way (its claim, sending_until, lies ahead). That attempt is left
--   alone (no second send at once, the per-endpoint bound holds); when it
--   records its outcome, the delivery is due again at once instead. The
--   next claim clears it: any attempt claimed after the request is the one
--   asked for. Not in any index, so the writes that set or clear it are as
--   cheap as before.
ALTER TABLE webhook_deliveries ALTER COLUMN run_id DROP NOT NULL;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_run_id_check
    CHECK ((run_id IS NULL) = (event_type = 'webhook.test'));
ALTER TABLE webhook_deliveries ADD COLUMN resend boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE webhook_deliveries DROP COLUMN resend;
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_run_id_check;
DELETE FROM webhook_deliveries WHERE run_id IS NULL;
ALTER TABLE webhook_deliveries ALTER COLUMN run_id SET NOT NULL;
