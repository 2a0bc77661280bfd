-- +goose Up
-- The webhook outbox (issue 19): a run's validation_run.finished event, one
-- delivery row per subscribed endpoint, inserted by the very statement that
-- writes the run's final state (models.RunStore), so no event is lost
-- between that commit and the send, and none is recorded twice. The event's
-- body is the final run (which never changes again), its id derived from the
-- run: evt_ + the run id's hex.
CREATE TABLE webhook_deliveries (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id          uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    endpoint_id     uuid        NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    run_id          uuid        NOT NULL REFERENCES validation_runs (id) ON DELETE CASCADE,
    -- webhook-id: the same on every attempt.
    event_id        text        NOT NULL,
    event_type      text        NOT NULL DEFAULT 'validation_run.finished',
    status          text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz DEFAULT now(),
    last_status_code integer,
    last_error      text        CHECK (char_length(last_error) <= 1000),
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    UNIQUE (endpoint_id, event_id)
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_endpoint_created_idx ON webhook_deliveries (endpoint_id, created_at DESC, id DESC);

-- +goose Down
DROP TABLE webhook_deliveries;
