package models_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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

// A run's final write never fails because an endpoint of its organisation
// is deleted at the same moment: every statement that ends runs (the fast
// path's batch, Finish, FailAttempt, Fail) ends each run on its first try
// while other connections delete endpoints (each delete held open a
// moment, as a slow one is), and records the event for the endpoints that
// still exist: every endpoint never deleted gets every run's event, and no
// delivery names an endpoint that is gone.
func TestRunEndsWhileEndpointsAreDeleted(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t, testdb.Options{MaxOpenConns: 16})
	ctx := context.Background()
	runs := models.NewRunStore(db)
	hooks := models.NewWebhookStore(db)
	org, wf := acmeWorkflow(t, db)
	endpoint := func() string {
		e := &models.WebhookEndpoint{OrgID: org, URL: "https://example.com/hooks", Events: models.JSON(`["validation_run.finished"]`), Secret: "whsec_AAAA"}
		require.NoError(t, hooks.Create(db, e))
		return e.ID
	}
	kept := []string{endpoint(), endpoint()}
	const enders, perEnder, batch = 8, 32, 4
	ids := make([][]string, enders)
	for i := range ids {
		require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, status, submission, metadata)
			SELECT ?, ?, 'queued', '{}', '{}' FROM generate_series(1, ?) RETURNING id`, org, wf, perEnder).Scan(&ids[i]).Error)
	}

	// Deleters: make an endpoint, then delete it in a transaction held
	// open a moment, until every run has ended.
	stop := make(chan struct{})
	var deleters sync.WaitGroup
	var deleted atomic.Int64
	deleteErrs := make(chan error, 3)
	for range 3 {
		deleters.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				e := &models.WebhookEndpoint{OrgID: org, URL: "https://example.com/gone", Events: models.JSON(`["validation_run.finished"]`), Secret: "whsec_AAAA"}
				err := hooks.Create(db, e)
				if err == nil {
					err = db.Transaction(func(tx *gorm.DB) error {
						if err := tx.Exec(`DELETE FROM webhook_endpoints WHERE id = ?`, e.ID).Error; err != nil {
							return err
						}
						time.Sleep(5 * time.Millisecond)
						return nil
					})
				}
				if err != nil {
					deleteErrs <- err
					return
				}
				deleted.Add(1)
			}
		})
	}

	// Enders: each ends its runs, a quarter by each statement; the first
	// try must end the run.
	var wg sync.WaitGroup
	errs := make(chan error, enders*perEnder)
	for i := range enders {
		wg.Go(func() {
			mine := ids[i]
			for j := 0; j < len(mine); {
				switch (j / batch) % 4 {
				case 0:
					outs := make([]models.Outcome, 0, batch)
					for _, id := range mine[j : j+batch] {
						outs = append(outs, models.Outcome{RunID: id, Status: models.RunPassed, StartedAt: time.Now()})
					}
					ended, err := runs.FinishUnclaimed(ctx, outs)
					if err == nil && len(ended) != batch {
						err = fmt.Errorf("a batch of %d ended %d runs", batch, len(ended))
					}
					if err != nil {
						errs <- err
					}
					j += batch
					continue
				case 1, 2:
					id := mine[j]
					c, err := runs.Claim(ctx, id, time.Minute, 5)
					if err != nil {
						errs <- err
						break
					}
					var ok bool
					if (j/batch)%4 == 1 {
						ok, err = runs.Finish(ctx, id, c.Attempts, models.RunFailed, nil)
					} else {
						ok, err = runs.FailAttempt(ctx, id, c.Attempts, "too long")
					}
					if err == nil && !ok {
						err = fmt.Errorf("run %s did not end on its first save", id)
					}
					if err != nil {
						errs <- err
					}
				case 3:
					ok, err := runs.Fail(ctx, mine[j], "gave up")
					if err == nil && !ok {
						err = fmt.Errorf("run %s did not end on its first save", mine[j])
					}
					if err != nil {
						errs <- err
					}
				}
				j++
			}
		})
	}
	wg.Wait()
	close(stop)
	deleters.Wait()
	close(errs)
	var failures []string
	for err := range errs {
		failures = append(failures, err.Error())
	}
	if len(failures) > 0 {
		t.Fatalf("%d final saves of %d runs failed; the first: %s", len(failures), enders*perEnder, failures[0])
	}
	close(deleteErrs)
	for err := range deleteErrs {
		require.NoError(t, err)
	}
	require.Positive(t, deleted.Load())

	var notFinal, missing, orphans int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM validation_runs WHERE org_id = ? AND finished_at IS NULL`, org).Scan(&notFinal).Error)
	require.Zero(t, notFinal)
	require.NoError(t, db.Raw(`SELECT count(*) FROM validation_runs r CROSS JOIN unnest(CAST(? AS uuid[])) AS k(id)
		WHERE r.org_id = ? AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.run_id = r.id AND d.endpoint_id = k.id)`,
		"{"+strings.Join(kept, ",")+"}", org).Scan(&missing).Error)
	require.Zero(t, missing, "an endpoint never deleted missed a run's event")
	require.NoError(t, db.Raw(`SELECT count(*) FROM webhook_deliveries d
		WHERE NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = d.endpoint_id)`).Scan(&orphans).Error)
	require.Zero(t, orphans)
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
