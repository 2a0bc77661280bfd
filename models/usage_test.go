package models_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// usageFixture is an organisation with a workflow on a fresh database.
type usageFixture struct {
	db      *gorm.DB
	org, wf string
	runs    *models.RunStore
	now     time.Time
}

func newUsageFixture(t *testing.T) *usageFixture {
	t.Helper()
	db, _ := testdb.New(t, testdb.Options{MaxOpenConns: 40})
	f := &usageFixture{db: db, runs: models.NewRunStore(db), now: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)}
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&f.org).Error)
	require.NoError(t, db.Raw(`INSERT INTO workflows (org_id, name) VALUES (?, 'wf') RETURNING id`, f.org).Scan(&f.wf).Error)
	return f
}

// begin opens a request transaction in which no lock wait may last more than
// 1 ms: a start that has to wait for another transaction fails instead.
func (f *usageFixture) begin(t *testing.T) *models.RequestTx {
	t.Helper()
	tx, _, err := models.BeginRequest(context.Background(), f.db, 10*time.Second, nil)
	require.NoError(t, err)
	t.Cleanup(tx.Rollback)
	require.NoError(t, tx.DB().Exec(`SET LOCAL lock_timeout = '1ms'`).Error)
	return tx
}

func (f *usageFixture) start(tx *models.RequestTx, quota int64, now time.Time) error {
	return f.runs.Start(tx, models.StartParams{
		ID: models.NewRunID(), CreatedAt: now, OrgID: f.org, WorkflowID: f.wf, Submission: []byte(`{}`), Quota: quota,
	})
}

// startCommitted starts one run in a transaction of its own and commits it.
func (f *usageFixture) startCommitted(t *testing.T, quota int64, now time.Time) error {
	t.Helper()
	tx, _, err := models.BeginRequest(context.Background(), f.db, 10*time.Second, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	if err := f.start(tx, quota, now); err != nil {
		return err
	}
	_, err = tx.Commit(context.Background(), nil)
	return err
}

func (f *usageFixture) usage(t *testing.T, now time.Time) int64 {
	t.Helper()
	u, err := models.NewUsageStore(f.db).Get(context.Background(), f.org, 0, now)
	require.NoError(t, err)
	return u.Runs
}

// No hot row: starts of one organisation in flight at the same time (their
// transactions open, each holding the usage slot it bumped) do not wait for
// each other, with or without a quota. Every start but the first of the
// period runs with a lock_timeout of 1 ms, so one that had to wait for
// another's lock would fail.
func TestUsageStartsDoNotWaitForEachOther(t *testing.T) {
	t.Parallel()
	for _, quota := range []int64{0, 1000} {
		t.Run(fmt.Sprintf("quota %d", quota), func(t *testing.T) { // one after the other: 30 connections each
			f := newUsageFixture(t)
			// The first start of the period creates and balances the slots.
			require.NoError(t, f.startCommitted(t, quota, f.now))

			const inFlight = 30 // under models.UsageSlots, above the API's pool size
			for i := range inFlight {
				tx := f.begin(t)
				require.NoError(t, f.start(tx, quota, f.now), "start %d of %d in flight", i+1, inFlight)
			}
			require.EqualValues(t, 1, f.usage(t, f.now), "the in-flight starts have not committed")
		})
	}
}

// The slots are balanced for the quota the start brings: a new month starts
// from zero, a carried-over count (migration 0002 leaves one slot with
// quota -1) is balanced on the next start, and a quota change rebalances
// without losing or inventing a run.
func TestUsageRebalances(t *testing.T) {
	t.Parallel()
	f := newUsageFixture(t)
	ctx := context.Background()

	// Carried over from usage_counters: 7 runs this month, not balanced.
	require.NoError(t, f.db.Exec(`INSERT INTO usage_slots (org_id, period, slot, runs, quota) VALUES (?, ?, 0, 7, -1)`,
		f.org, models.UsagePeriod(f.now)).Error)
	require.EqualValues(t, 7, f.usage(t, f.now))

	startN := func(n int, quota int64, now time.Time) (ok, refused int) {
		for range n {
			err := f.startCommitted(t, quota, now)
			switch {
			case err == nil:
				ok++
			default:
				require.ErrorIs(t, err, models.ErrQuotaExceeded)
				refused++
			}
		}
		return ok, refused
	}
	ok, refused := startN(5, 10, f.now)
	require.Equal(t, 3, ok, "quota 10 with 7 carried over")
	require.Equal(t, 2, refused)
	require.EqualValues(t, 10, f.usage(t, f.now))

	ok, _ = startN(10, 15, f.now)
	require.Equal(t, 5, ok, "raised to 15")
	ok, _ = startN(3, 12, f.now)
	require.Zero(t, ok, "lowered to 12, below the 15 used")
	require.EqualValues(t, 15, f.usage(t, f.now))
	ok, _ = startN(4, 0, f.now)
	require.Equal(t, 4, ok, "unlimited")
	ok, _ = startN(4, 20, f.now)
	require.Equal(t, 1, ok, "19 used of 20")
	require.EqualValues(t, 20, f.usage(t, f.now))

	// Every slot holds at most its cap, or all are full (the invariant).
	var over, slots int64
	require.NoError(t, f.db.Raw(`SELECT count(*) FILTER (WHERE runs > cap), count(*) FROM usage_slots WHERE org_id = ? AND period = ?`,
		f.org, models.UsagePeriod(f.now)).Row().Scan(&over, &slots))
	require.EqualValues(t, models.UsageSlots, slots)
	require.Zero(t, over, "exactly at the quota: every slot at its cap")

	// A new month starts from zero, and the old one keeps its count.
	next := f.now.AddDate(0, 1, 0)
	ok, _ = startN(3, 2, next)
	require.Equal(t, 2, ok)
	require.EqualValues(t, 2, f.usage(t, next))
	require.EqualValues(t, 20, f.usage(t, f.now))

	u, err := models.NewUsageStore(f.db).Get(ctx, f.org, 500, next)
	require.NoError(t, err)
	require.EqualValues(t, 500, u.Quota, "no quota of its own: the default applies")
	require.True(t, u.Period.Equal(models.UsagePeriod(next)))

	var runs int64
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM validation_runs`).Scan(&runs).Error)
	require.EqualValues(t, 20-7+2, runs, "one run per admitted start (7 were carried over)")
}

// An unknown workflow bills nothing, on the fast path and the slow one.
func TestUsageUnknownWorkflowBillsNothing(t *testing.T) {
	t.Parallel()
	f := newUsageFixture(t)
	good := f.wf
	f.wf = "00000000-0000-0000-0000-000000000000"
	require.ErrorIs(t, f.startCommitted(t, 0, f.now), models.ErrNotFound, "slow path: no slots yet")
	f.wf = good
	require.NoError(t, f.startCommitted(t, 0, f.now))
	f.wf = "00000000-0000-0000-0000-000000000000"
	require.ErrorIs(t, f.startCommitted(t, 0, f.now), models.ErrNotFound, "fast path")
	require.EqualValues(t, 1, f.usage(t, f.now))
}
