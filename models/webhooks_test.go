package models_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// Every statement that ends a run records its validation_run.finished
// event, one delivery per subscribed endpoint of the run's organisation,
// in the same statement (the outbox): the fast path's batch
// (FinishUnclaimed), the claimed path (Finish, FailAttempt) and Fail. A run
// ends once, so its event is recorded once, whatever is retried; an
// organisation without endpoints gets none, and another organisation's or a
// deleted endpoint hears nothing.
func TestFinalWritesRecordTheEventOnce(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	runs := models.NewRunStore(db)
	hooks := models.NewWebhookStore(db)
	org := func(name string) (id, wf string) {
		require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES (?, ?) RETURNING id`, name, name).Scan(&id).Error)
		require.NoError(t, db.Raw(`INSERT INTO workflows (org_id, name) VALUES (?, 'wf') RETURNING id`, id).Scan(&wf).Error)
		return id, wf
	}
	endpoint := func(orgID string) string {
		e := &models.WebhookEndpoint{OrgID: orgID, URL: "https://example.com/" + orgID, Events: models.JSON(`["validation_run.finished"]`), Secret: "whsec_AAAA"}
		require.NoError(t, hooks.Create(db, e))
		return e.ID
	}
	run := func(orgID, wf string) string {
		var id string
		require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, status, submission, metadata)
			VALUES (?, ?, 'queued', '{}', '{}') RETURNING id`, orgID, wf).Scan(&id).Error)
		return id
	}
	deliveries := func(runID string) []string {
		var eps []string
		require.NoError(t, db.Raw(`SELECT endpoint_id FROM webhook_deliveries WHERE run_id = ? AND status = 'pending'
			AND event_id = 'evt_' || replace(run_id::text, '-', '') ORDER BY endpoint_id`, runID).Scan(&eps).Error)
		return eps
	}

	acme, acmeWF := org("acme")
	quiet, quietWF := org("quiet")
	other, _ := org("other")
	e1, e2 := endpoint(acme), endpoint(acme)
	gone := endpoint(acme)
	require.NoError(t, hooks.Delete(ctx, acme, gone))
	endpoint(other)
	want := []string{e1, e2}
	if want[0] > want[1] {
		want[0], want[1] = want[1], want[0]
	}

	// The fast path: a batch of queued runs ended in one statement.
	fast, fastQuiet := run(acme, acmeWF), run(quiet, quietWF)
	outs := []models.Outcome{
		{RunID: fast, Status: models.RunPassed, StartedAt: time.Now()},
		{RunID: fastQuiet, Status: models.RunFailed, StartedAt: time.Now()},
	}
	ended, err := runs.FinishUnclaimed(ctx, outs)
	require.NoError(t, err)
	require.Equal(t, map[string]bool{fast: true, fastQuiet: true}, ended)
	ended, err = runs.FinishUnclaimed(ctx, outs) // again: nothing ends twice
	require.NoError(t, err)
	require.Empty(t, ended)
	require.Equal(t, want, deliveries(fast))
	require.Empty(t, deliveries(fastQuiet), "an organisation without endpoints records no delivery")

	// The claimed path: Finish, and FailAttempt.
	for _, end := range []func(id string, attempt int) (bool, error){
		func(id string, attempt int) (bool, error) {
			return runs.Finish(ctx, id, attempt, models.RunFailed, nil)
		},
		func(id string, attempt int) (bool, error) { return runs.FailAttempt(ctx, id, attempt, "too long") },
	} {
		id := run(acme, acmeWF)
		c, err := runs.Claim(ctx, id, time.Minute, 5)
		require.NoError(t, err)
		ok, err := end(id, c.Attempts)
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = end(id, c.Attempts)
		require.NoError(t, err)
		require.False(t, ok, "a run ends once")
		require.Equal(t, want, deliveries(id))
	}

	// Fail: a queued run whose task failed for good.
	failed := run(acme, acmeWF)
	ok, err := runs.Fail(ctx, failed, "gave up")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = runs.Fail(ctx, failed, "gave up")
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, want, deliveries(failed))

	// Nothing else was recorded: one event per ended run per endpoint.
	var n int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM webhook_deliveries`).Scan(&n).Error)
	require.EqualValues(t, 4*2, n)
	var otherN int64
	require.NoError(t, db.Session(&gorm.Session{}).Raw(`SELECT count(*) FROM webhook_deliveries WHERE org_id = ?`, other).Scan(&otherN).Error)
	require.Zero(t, otherN)
}

// A claim of a delivery is fenced: once it ran out and the delivery was
// claimed again, the attempt made under the old claim neither reads the
// delivery to send it nor records its outcome over the newer claim. An
// attempt's outcome is recorded once, and a claim that ran out and was
// not taken again still records.
func TestLateAttemptNeverRecordsOverANewerClaim(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	hooks := models.NewWebhookStore(db)
	org, wf := acmeWorkflow(t, db)
	ep := &models.WebhookEndpoint{OrgID: org, URL: "https://example.com/hooks", Events: models.JSON(`["validation_run.finished"]`), Secret: "whsec_AAAA"}
	require.NoError(t, hooks.Create(db, ep))
	var run, id string
	require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, status, submission, metadata)
		VALUES (?, ?, 'queued', '{}', '{}') RETURNING id`, org, wf).Scan(&run).Error)
	require.NoError(t, db.Raw(`INSERT INTO webhook_deliveries (org_id, endpoint_id, run_id, event_id)
		VALUES (?, ?, ?, 'evt_1') RETURNING id`, org, ep.ID, run).Scan(&id).Error)
	// A lease of 0: each claim has run out by the next statement.
	claim := func() models.DeliveryClaim {
		t.Helper()
		cs, err := hooks.ClaimDueDeliveries(ctx, 10, 4, 0)
		require.NoError(t, err)
		require.Len(t, cs, 1)
		require.Equal(t, id, cs[0].ID)
		return cs[0]
	}
	attempts := func() (n int, status string) {
		t.Helper()
		require.NoError(t, db.Raw(`SELECT attempts, status FROM webhook_deliveries WHERE id = ?`, id).Row().Scan(&n, &status))
		return n, status
	}
	failed := models.Attempt{Error: "connection refused", Retry: 0}

	old := claim()
	newer := claim()
	require.True(t, newer.Claim.After(old.Claim), "each claim is a new one")
	_, err := hooks.DeliveryJob(ctx, id, old.Claim)
	require.ErrorIs(t, err, models.ErrNotFound, "the old claim's attempt has nothing to send")
	job, err := hooks.DeliveryJob(ctx, id, newer.Claim)
	require.NoError(t, err)
	require.Equal(t, "evt_1", job.Delivery.EventID)

	status, err := hooks.RecordAttempt(ctx, id, old.Claim, models.Attempt{Delivered: true, StatusCode: 200}, time.Hour)
	require.NoError(t, err)
	require.Empty(t, status, "a late attempt records nothing over a newer claim")
	n, st := attempts()
	require.Equal(t, 0, n)
	require.Equal(t, models.DeliveryPending, st)

	status, err = hooks.RecordAttempt(ctx, id, newer.Claim, failed, time.Hour)
	require.NoError(t, err)
	require.Equal(t, models.DeliveryPending, status, "the newer claim's attempt records, its lease run out or not")
	status, err = hooks.RecordAttempt(ctx, id, newer.Claim, failed, time.Hour)
	require.NoError(t, err)
	require.Empty(t, status, "an attempt records its outcome once")
	n, _ = attempts()
	require.Equal(t, 1, n)

	next := claim() // due again at once (Retry 0)
	status, err = hooks.RecordAttempt(ctx, id, next.Claim, models.Attempt{Delivered: true, StatusCode: 204}, time.Hour)
	require.NoError(t, err)
	require.Equal(t, models.DeliveryDelivered, status)
	n, st = attempts()
	require.Equal(t, 2, n)
	require.Equal(t, models.DeliveryDelivered, st)
}
