-- +goose Up
-- Every tenant gets its share: an operator's per-organisation overrides of
-- the admission rate and of the run share (`valruns org rate|share`).
-- NULL means the process default applies (ORG_START_RATE, ORG_RUN_SHARE);
-- 0 means unlimited.
ALTER TABLE organizations
    -- starts per second admitted for the organisation, across all API
    -- processes (a token bucket in Redis; its burst is a second's worth).
    ADD COLUMN start_rate integer CHECK (start_rate >= 0),
    -- how many of the organisation's runs may wait in the queue (Redis) at
    -- once; the rest wait their turn in PostgreSQL, in order.
    ADD COLUMN run_share integer CHECK (run_share >= 0);

-- +goose Down
ALTER TABLE organizations DROP COLUMN run_share, DROP COLUMN start_rate;
