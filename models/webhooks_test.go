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
