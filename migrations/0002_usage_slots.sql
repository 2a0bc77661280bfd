-- +goose Up
-- Usage metering without a hot row. usage_counters had one row per
-- organisation and month that every start updated and kept locked until its
-- commit, so all starts of an organisation queued behind each other.
--
-- usage_slots splits that counter into slots (the escrow pattern): a start
-- bumps any slot that no other transaction holds (FOR UPDATE SKIP LOCKED) and
-- that still has room, so concurrent starts of one organisation take
-- different rows. The runs of a period are the sum of its slots.
--
-- The quota stays exact. Each slot holds its share (cap) of the quota the
-- slots were balanced for: a start only bumps a slot whose runs < cap, so the
-- sum never passes the quota, and a start that finds every slot full knows
-- the quota is used. When a start brings another quota than the slots'
-- (the organisation's quota changed, or the month is new), it rebalances
-- them under a lock: total runs redistributed slot by slot up to each cap.
-- Invariant: runs <= cap in every slot, or every slot is full.
CREATE TABLE usage_slots (
    org_id uuid   NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    -- first day of the calendar month (UTC) counted.
    period date   NOT NULL CHECK (extract(day FROM period) = 1),
    slot   integer NOT NULL CHECK (slot >= 0),
    runs   bigint NOT NULL DEFAULT 0 CHECK (runs >= 0),
    -- the quota the slots of this organisation and period were balanced for:
    -- 0 means unlimited (cap unused); -1 means not balanced yet.
    quota  bigint NOT NULL CHECK (quota >= -1),
    -- this slot's share of quota.
    cap    bigint NOT NULL DEFAULT 0 CHECK (cap >= 0),
    PRIMARY KEY (org_id, period, slot)
) WITH (fillfactor = 50); -- room on each page for HOT updates of runs

-- What was counted so far, in slot 0 and not balanced yet: the first start
-- of each organisation rebalances it for its quota.
INSERT INTO usage_slots (org_id, period, slot, runs, quota, cap)
SELECT org_id, period, 0, runs, -1, 0 FROM usage_counters;

DROP TABLE usage_counters;

-- +goose StatementBegin
-- idempotency_key_taken raises unique_violation: the request's key insert
-- calls it when it could not write its row (a live row exists), so the
-- COMMIT sent with it in one round trip fails instead of committing.
-- (It returns timestamptz only to fit where the statement expects the
-- saved row's expires_at.)
CREATE FUNCTION idempotency_key_taken() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'idempotency key already finished by another request'
        USING ERRCODE = 'unique_violation', CONSTRAINT = 'idempotency_keys_org_id_endpoint_key_key';
END $$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION idempotency_key_taken();

CREATE TABLE usage_counters (
    org_id     uuid        NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    period     date        NOT NULL CHECK (extract(day FROM period) = 1),
    runs       bigint      NOT NULL DEFAULT 0 CHECK (runs >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, period)
);
INSERT INTO usage_counters (org_id, period, runs)
SELECT org_id, period, sum(runs) FROM usage_slots GROUP BY org_id, period;

DROP TABLE usage_slots;
