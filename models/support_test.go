package models_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// A redelivery makes a delivery due again at once, whatever its status,
// with the same event. While an attempt is under way (a live claim) it
// leaves that attempt alone: no other worker claims the delivery meanwhile
// (never two sends at once), and the attempt's outcome, even a 2xx, leaves
// it due again at once; the next claim's attempt is the one asked for.
// Another organisation's or another endpoint's delivery is ErrNotFound.
func TestRedeliverHonoursTheClaimUnderWay(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	hooks := models.NewWebhookStore(db)
	org, wf := acmeWorkflow(t, db)
	ep := &models.WebhookEndpoint{OrgID: org, URL: "https://example.com/hooks", Events: models.JSON(`["validation_run.finished"]`), Secret: "whsec_AAAA"}
	require.NoError(t, hooks.Create(db, ep))
	other := &models.WebhookEndpoint{OrgID: org, URL: "https://example.com/other", Events: models.JSON(`["validation_run.finished"]`), Secret: "whsec_AAAA"}
	require.NoError(t, hooks.Create(db, other))
	var run, id, otherOrg string
	require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, status, submission, metadata)
		VALUES (?, ?, 'queued', '{}', '{}') RETURNING id`, org, wf).Scan(&run).Error)
	require.NoError(t, db.Raw(`INSERT INTO webhook_deliveries (org_id, endpoint_id, run_id, event_id)
		VALUES (?, ?, ?, 'evt_1') RETURNING id`, org, ep.ID, run).Scan(&id).Error)
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('Other', 'other') RETURNING id`).Scan(&otherOrg).Error)

	claims := func(lease time.Duration) []models.DeliveryClaim {
		t.Helper()
		cs, err := hooks.ClaimDueDeliveries(ctx, 10, 4, lease)
		require.NoError(t, err)
		return cs
	}
	row := func() (status string, attempts int, due bool) {
		t.Helper()
		require.NoError(t, db.Raw(`SELECT status, attempts, coalesce(next_attempt_at <= now(), false) FROM webhook_deliveries WHERE id = ?`, id).
			Row().Scan(&status, &attempts, &due))
		return status, attempts, due
	}

	_, err := hooks.Redeliver(db, otherOrg, ep.ID, id)
	require.ErrorIs(t, err, models.ErrNotFound, "another organisation's delivery")
	_, err = hooks.Redeliver(db, org, other.ID, id)
	require.ErrorIs(t, err, models.ErrNotFound, "another endpoint's delivery")

	// Delivered, then sent again on request: pending, due now, the same event.
	cs := claims(time.Minute)
	require.Len(t, cs, 1)
	st, err := hooks.RecordAttempt(ctx, id, cs[0].Claim, models.Attempt{Delivered: true, StatusCode: 200}, time.Hour)
	require.NoError(t, err)
	require.Equal(t, models.DeliveryDelivered, st)
	d, err := hooks.Redeliver(db, org, ep.ID, id)
	require.NoError(t, err)
	require.Equal(t, models.DeliveryPending, d.Status)
	require.Equal(t, "evt_1", d.EventID)
	require.Nil(t, d.DeliveredAt)
	require.Equal(t, 1, d.Attempts)

	// Claimed: an attempt is under way. A redelivery now does not free it
	// for another claim...
	cs = claims(time.Minute)
	require.Len(t, cs, 1)
	live := cs[0]
	_, err = hooks.Redeliver(db, org, ep.ID, id)
	require.NoError(t, err)
	require.Empty(t, claims(time.Minute), "no second attempt while one is under way")
	job, err := hooks.DeliveryJob(ctx, id, live.Claim)
	require.NoError(t, err, "the attempt under way still sends")
	require.Equal(t, "evt_1", job.Delivery.EventID)
	// ...and its outcome, a 2xx, leaves the delivery due again at once.
	st, err = hooks.RecordAttempt(ctx, id, live.Claim, models.Attempt{Delivered: true, StatusCode: 200}, time.Hour)
	require.NoError(t, err)
	require.Equal(t, models.DeliveryPending, st)
	status, attempts, due := row()
	require.Equal(t, models.DeliveryPending, status)
	require.Equal(t, 2, attempts)
	require.True(t, due)

	// The next claim's attempt is the one asked for: its outcome stands.
	cs = claims(time.Minute)
	require.Len(t, cs, 1)
	st, err = hooks.RecordAttempt(ctx, id, cs[0].Claim, models.Attempt{Delivered: true, StatusCode: 204}, time.Hour)
	require.NoError(t, err)
	require.Equal(t, models.DeliveryDelivered, st)

	// A claim that ran out (its worker died) and was taken again: the new
	// claim's attempt is the redelivery, once.
	_, err = hooks.Redeliver(db, org, ep.ID, id)
	require.NoError(t, err)
	cs = claims(0)
	require.Len(t, cs, 1)
	// (Redelivered while that claim was live: simulate it by the flag the
	// redelivery sets under a live claim.)
	require.NoError(t, db.Exec(`UPDATE webhook_deliveries SET resend = true WHERE id = ?`, id).Error)
	cs = claims(time.Minute)
	require.Len(t, cs, 1, "the claim ran out: the delivery is claimed again")
	st, err = hooks.RecordAttempt(ctx, id, cs[0].Claim, models.Attempt{Delivered: true, StatusCode: 200}, time.Hour)
	require.NoError(t, err)
	require.Equal(t, models.DeliveryDelivered, st, "the newer claim made the attempt asked for")

	// Failed past its horizon, sent again: one attempt, failed again if it fails.
	require.NoError(t, db.Exec(`UPDATE webhook_deliveries SET status = 'failed', next_attempt_at = NULL, delivered_at = NULL,
		created_at = now() - interval '3 days' WHERE id = ?`, id).Error)
	_, err = hooks.Redeliver(db, org, ep.ID, id)
	require.NoError(t, err)
	cs = claims(time.Minute)
	require.Len(t, cs, 1)
	st, err = hooks.RecordAttempt(ctx, id, cs[0].Claim, models.Attempt{StatusCode: 500, Error: "answered 500", Retry: time.Second}, 24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, models.DeliveryFailed, st)
}

// A test event is a delivery about no run, due at once, attempted once: a
// failed attempt fails it, with no retry. At most maxPending of one
// endpoint wait for their attempt; another organisation's endpoint is
// ErrNotFound.
func TestSendTestEvent(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	hooks := models.NewWebhookStore(db)
	org, _ := acmeWorkflow(t, db)
	var otherOrg string
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('Other', 'other') RETURNING id`).Scan(&otherOrg).Error)
	ep := &models.WebhookEndpoint{OrgID: org, URL: "https://example.com/hooks", Events: models.JSON(`["validation_run.finished"]`), Secret: "whsec_AAAA"}
	require.NoError(t, hooks.Create(db, ep))

	_, err := hooks.SendTestEvent(db, otherOrg, ep.ID, 2)
	require.ErrorIs(t, err, models.ErrNotFound)

	d, err := hooks.SendTestEvent(db, org, ep.ID, 2)
	require.NoError(t, err)
	require.Equal(t, models.EventTest, d.EventType)
	require.Nil(t, d.RunID)
	require.Equal(t, models.DeliveryPending, d.Status)
	require.Regexp(t, `^evt_[0-9a-f]{32}$`, d.EventID)
	d2, err := hooks.SendTestEvent(db, org, ep.ID, 2)
	require.NoError(t, err)
	require.NotEqual(t, d.EventID, d2.EventID, "each test is an event of its own")
	_, err = hooks.SendTestEvent(db, org, ep.ID, 2)
	require.ErrorIs(t, err, models.ErrTestsPending)

	cs, err := hooks.ClaimDueDeliveries(ctx, 10, 4, time.Minute)
	require.NoError(t, err)
	require.Len(t, cs, 2, "due at once")
	job, err := hooks.DeliveryJob(ctx, cs[0].ID, cs[0].Claim)
	require.NoError(t, err)
	require.Nil(t, job.Run, "about no run")
	st, err := hooks.RecordAttempt(ctx, cs[0].ID, cs[0].Claim, models.Attempt{StatusCode: 500, Error: "answered 500", Retry: time.Second}, 24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, models.DeliveryFailed, st, "attempted once")
	st, err = hooks.RecordAttempt(ctx, cs[1].ID, cs[1].Claim, models.Attempt{Delivered: true, StatusCode: 200}, 24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, models.DeliveryDelivered, st)
	_, err = hooks.SendTestEvent(db, org, ep.ID, 2)
	require.NoError(t, err, "none pending: room again")

	// A delivery of a run still names it: the database refuses nonsense.
	require.Error(t, db.Exec(`INSERT INTO webhook_deliveries (org_id, endpoint_id, event_id) VALUES (?, ?, 'evt_x')`, org, ep.ID).Error)
}
