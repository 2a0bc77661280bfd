-- +goose Up
-- Webhook endpoints (issue 19): where an organisation wants to hear of its
-- runs' events. The signing secret is kept as written (the service signs
-- with it, so it cannot be a hash); the API shows it only when it is made.
CREATE TABLE webhook_endpoints (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id      uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    url         text        NOT NULL CHECK (char_length(url) BETWEEN 1 AND 2048),
    description text        NOT NULL DEFAULT '' CHECK (char_length(description) <= 500),
    -- the event types delivered: a non-empty array of strings.
    events      jsonb       NOT NULL CHECK (jsonb_typeof(events) = 'array' AND jsonb_array_length(events) > 0),
    -- "whsec_" + base64 of the key bytes.
    secret      text        NOT NULL,
    -- after a rotation: the secret it replaced, which keeps signing beside
    -- the new one until previous_secret_expires_at.
    previous_secret            text,
    previous_secret_expires_at timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((previous_secret IS NULL) = (previous_secret_expires_at IS NULL))
);
CREATE INDEX webhook_endpoints_org_created_idx ON webhook_endpoints (org_id, created_at DESC, id DESC);

-- +goose Down
DROP TABLE webhook_endpoints;
