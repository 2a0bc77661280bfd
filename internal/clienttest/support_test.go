package clienttest

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/client"
	"github.com/valruns/valruns/models"
)

// ListRuns with WithStatus, WithCreatedAfter and WithCreatedBefore lists
// only the runs they let through, newest first, across pages, combined
// with the workflow; a filter the server refuses ends the iteration with a
// 400 that names it.
func TestListRunsFilters(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	c := s.client()
	ctx := t.Context()
	var ids []string
	var created []time.Time
	for i := range 6 {
		res, err := c.StartRun(ctx, s.wf, map[string]int{"i": i})
		require.NoError(t, err)
		ids = append(ids, res.Run.ID)
		created = append(created, res.Run.CreatedAt)
	}
	// Runs 1 and 4 failed, 2 passed; the rest stay queued.
	for i, st := range map[int]string{1: models.RunFailed, 4: models.RunFailed, 2: models.RunPassed} {
		require.NoError(t, s.env.DB.Exec(`UPDATE validation_runs SET status = ?, finished_at = now(), findings = '[]' WHERE id = ?`, st, ids[i]).Error)
		require.NoError(t, s.env.DB.Exec(`DELETE FROM unfinished_runs WHERE id = ?`, ids[i]).Error)
	}
	collect := func(wf string, opts ...client.ListOption) []string {
		t.Helper()
		var out []string
		for r, err := range c.ListRuns(ctx, wf, opts...) {
			require.NoError(t, err)
			out = append(out, r.ID)
		}
		return out
	}
	require.Equal(t, []string{ids[4], ids[1]}, collect("", client.WithStatus(client.StatusFailed), client.WithPageSize(1)))
	require.Equal(t, []string{ids[5], ids[3], ids[0]}, collect(s.wf, client.WithStatus(client.StatusQueued), client.WithPageSize(2)))
	require.Equal(t, []string{ids[4]}, collect("", client.WithStatus(client.StatusFailed), client.WithCreatedAfter(created[1])))
	require.Equal(t, []string{ids[1], ids[0]}, collect("", client.WithCreatedBefore(created[2])))
	require.Equal(t, []string{ids[3], ids[2]}, collect("", client.WithCreatedAfter(created[1]), client.WithCreatedBefore(created[4])))
	require.Len(t, collect("", client.WithStatus(client.StatusFailed), client.WithStatus("")), 6, `WithStatus("") lists any`)

	var errs []error
	for _, err := range c.ListRuns(ctx, "", client.WithStatus("done")) {
		errs = append(errs, err)
	}
	require.Len(t, errs, 1)
	var e *client.Error
	require.ErrorAs(t, errs[0], &e)
	require.Equal(t, http.StatusBadRequest, e.Status)
	require.Equal(t, []client.FieldError{{Field: "status", Message: "must be one of queued, running, passed, failed, error"}}, e.Errors)
}

// RedeliverWebhook and SendWebhookTest against the real server: each call
// is one key, a retry with it replays (Replayed) and asks for nothing
// more; the test event shows in ListWebhookDeliveries; 404 and the stored
// 429 test_events_pending are typed errors, never retried.
func TestRedeliverAndTestEvent(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	c := s.client(client.WithBackoff(time.Millisecond, time.Millisecond))
	ctx := t.Context()
	r := s.env.Do(http.MethodPost, "/api/webhook-endpoints/", s.org.Token, `{"url":"https://example.com/hooks"}`)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	ep := r.Map(t)["id"].(string)

	test, err := c.SendWebhookTest(ctx, ep, client.WithKey("test-1"))
	require.NoError(t, err)
	require.False(t, test.Replayed)
	require.Equal(t, client.EventTest, test.Delivery.EventType)
	require.Equal(t, client.DeliveryPending, test.Delivery.Status)
	require.Empty(t, test.Delivery.RunID)
	again, err := c.SendWebhookTest(ctx, ep, client.WithKey("test-1"))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, test.Delivery, again.Delivery)
	var listed []client.WebhookDelivery
	for d, err := range c.ListWebhookDeliveries(ctx, ep) {
		require.NoError(t, err)
		listed = append(listed, d)
	}
	require.Equal(t, []client.WebhookDelivery{test.Delivery}, listed, "one event for the key, in the deliveries")

	// Sent once (delivered), then again on request: due now, the same event.
	require.NoError(t, s.env.DB.Exec(`UPDATE webhook_deliveries SET status = 'delivered', attempts = 1, next_attempt_at = NULL, delivered_at = now() WHERE id = ?`,
		test.Delivery.ID).Error)
	re, err := c.RedeliverWebhook(ctx, ep, test.Delivery.ID)
	require.NoError(t, err)
	require.Equal(t, client.DeliveryPending, re.Delivery.Status)
	require.Equal(t, test.Delivery.EventID, re.Delivery.EventID)
	require.Equal(t, 1, re.Delivery.Attempts)
	require.NotNil(t, re.Delivery.NextAttemptAt)
	replay, err := c.RedeliverWebhook(ctx, ep, test.Delivery.ID, client.WithKey(re.Key))
	require.NoError(t, err)
	require.True(t, replay.Replayed)

	_, err = c.RedeliverWebhook(ctx, ep, models.NewRunID())
	require.ErrorIs(t, err, client.ErrNotFound)
	_, err = c.SendWebhookTest(ctx, models.NewRunID())
	require.ErrorIs(t, err, client.ErrNotFound)

	for range 4 {
		_, err := c.SendWebhookTest(ctx, ep)
		require.NoError(t, err)
	}
	before := s.hits.Load()
	_, err = c.SendWebhookTest(ctx, ep)
	require.ErrorIs(t, err, client.ErrTestEventsPending)
	var e *client.Error
	require.True(t, errors.As(err, &e))
	require.Equal(t, http.StatusTooManyRequests, e.Status)
	require.EqualValues(t, 1, s.hits.Load()-before, "not retried")
}
