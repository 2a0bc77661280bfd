package models

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"gorm.io/gorm"
)

// UsageSlots is how many counter slots meter an organisation's runs in a
// period (migration 0002 explains the escrow): that many starts of one
// organisation can hold a slot at once without waiting for each other. It
// is above the pool size of two API replicas, so in practice starts only
// wait on each other at the very edge of a quota.
const UsageSlots = 64

// rebalanceLockClass is the first half of the two-int advisory lock that
// serialises the rebalancing of one organisation's slots (the second half is
// a hash of the organisation and period). The two-int form is a lock space
// of its own, apart from the idempotency keys' bigint locks.
const rebalanceLockClass = 0x76616c72 // "valr"

// UsagePeriod is the first instant of the calendar month (UTC) that counts t.
func UsagePeriod(t time.Time) time.Time {
	u := t.UTC()
	return time.Date(u.Year(), u.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// claimSlot claims a slot on tx for one run of the organisation, waiting
// for slots other transactions hold, and rebalancing the slots when they
// were balanced for another quota (or do not exist yet). It returns
// ErrQuotaExceeded when every slot is full: the quota is used.
//
// The slow path is serialised per organisation and period by an advisory
// lock, taken before any slot is locked. That matters: a waiting claim can
// keep locks on slots it passed over (a slot found full once its holder
// committed stays locked), so two slow paths that waited for each other's
// slots while one also waited for the lock would deadlock. Fast-path
// claimers never wait (SKIP LOCKED), so the lock holder only ever waits for
// them to commit.
func claimSlot(tx *gorm.DB, orgID string, period time.Time, quota int64) error {
	balanced, open, err := slotState(tx, orgID, period, quota)
	if err != nil {
		return err
	}
	if quota > 0 && balanced == UsageSlots && open == 0 {
		// Every slot full as of a committed state: runs never go down, so
		// the quota is used (the common 429, decided without a lock).
		return ErrQuotaExceeded
	}
	if err := tx.Exec(`SELECT pg_advisory_xact_lock(?, hashtext(CAST(? AS text) || CAST(? AS text)))`,
		rebalanceLockClass, orgID, period).Error; err != nil {
		return fmt.Errorf("lock usage slots: %w", translate(err))
	}
	// Again, as of after the wait: whoever held the lock may have rebalanced.
	if balanced, _, err = slotState(tx, orgID, period, quota); err != nil {
		return err
	}
	if balanced != UsageSlots {
		if err := rebalance(tx, orgID, period, quota); err != nil {
			return err
		}
	}
	ok, err := claimSlotWaiting(tx, orgID, period, quota)
	if err != nil {
		return err
	}
	if !ok {
		return ErrQuotaExceeded
	}
	return nil
}

// slotState counts the organisation's slots of period balanced for quota,
// and those of them with room, as of the statement's snapshot.
func slotState(tx *gorm.DB, orgID string, period time.Time, quota int64) (balanced, open int64, err error) {
	var st struct{ Balanced, Open int64 }
	err = tx.Raw(slotStateSQL,
		map[string]any{"org": orgID, "period": period, "quota": quota}).Scan(&st).Error
	if err != nil {
		return 0, 0, fmt.Errorf("usage slots: %w", translate(err))
	}
	return st.Balanced, st.Open, nil
}

// claimSlotWaiting bumps the first slot with room, waiting for it if another
// transaction holds it; a slot that turns out full once its holder commits is
// passed over (PostgreSQL re-checks the condition on the newest version).
func claimSlotWaiting(tx *gorm.DB, orgID string, period time.Time, quota int64) (bool, error) {
	res := tx.Exec(claimSlotWaitingSQL,
		map[string]any{"org": orgID, "period": period, "quota": quota})
	if res.Error != nil {
		return false, fmt.Errorf("claim usage slot: %w", translate(res.Error))
	}
	return res.RowsAffected == 1, nil
}

// rebalance rewrites the organisation's slots of period for quota: the runs
// counted so far (every slot locked first, so none is in flight) are laid
// into the slots in order, each up to its cap (quota / UsageSlots, the
// remainder spread over the first slots). Past the quota the excess stays
// in slot 0, so every slot is full. Unlimited (quota 0): all in slot 0.
func rebalance(tx *gorm.DB, orgID string, period time.Time, quota int64) error {
	var total int64
	if err := tx.Raw(lockUsageSlotsSQL,
		orgID, period).Scan(&total).Error; err != nil {
		return fmt.Errorf("lock usage slots: %w", translate(err))
	}
	err := tx.Exec(rebalanceSlotsSQL,
		map[string]any{"org": orgID, "period": period, "quota": quota, "total": total, "slots": UsageSlots}).Error
	if err != nil {
		return fmt.Errorf("rebalance usage slots: %w", translate(err))
	}
	return nil
}

// The usage slots' statements, each in sql/ under its name.
var (
	slotStateSQL        = statement("slot_state")
	claimSlotWaitingSQL = statement("claim_slot_waiting")
	lockUsageSlotsSQL   = statement("lock_usage_slots")
	rebalanceSlotsSQL   = statement("rebalance_slots")
	usageOfPeriodSQL    = statement("usage_of_period")
)

// slotOffset spreads the starts of one organisation over its slots.
func slotOffset() int { return rand.IntN(UsageSlots) }

// Usage is what an organisation has used of a period.
type Usage struct {
	// Period is the first instant of the month (UTC).
	Period time.Time
	// Runs started in the period: what is billed.
	Runs int64
	// Quota is the effective monthly quota; 0 means unlimited.
	Quota int64
}

// UsageStore reads what organisations have used.
type UsageStore struct{ db *gorm.DB }

// NewUsageStore returns a UsageStore on db.
func NewUsageStore(db *gorm.DB) *UsageStore { return &UsageStore{db: db} }

// Get returns the organisation's usage of the period holding now, with its
// effective quota: its own, or defaultQuota when it has none. The quota is
// read from the database, not from a cached token, so it is the one the next
// start will apply once caches catch up. No such organisation is
// ErrOrgGone.
func (s *UsageStore) Get(ctx context.Context, orgID string, defaultQuota int64, now time.Time) (*Usage, error) {
	period := UsagePeriod(now)
	var row struct {
		Runs  int64
		Quota *int64
	}
	res := s.db.WithContext(ctx).Raw(usageOfPeriodSQL, period, orgID).Scan(&row)
	if res.Error != nil {
		return nil, fmt.Errorf("usage: %w", translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return nil, fmt.Errorf("usage: %w", ErrOrgGone)
	}
	u := &Usage{Period: period, Runs: row.Runs, Quota: defaultQuota}
	if row.Quota != nil {
		u.Quota = *row.Quota
	}
	return u, nil
}
