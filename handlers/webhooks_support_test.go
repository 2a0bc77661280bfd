package handlers_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
)

// exDelivery starts a run of a new workflow of org and ends it, so that the
// endpoint records its event, and returns the delivery's id.
func exDelivery(t *testing.T, e *apitest.Env, org apitest.Org, endpoint string) handlers.WebhookDelivery {
	t.Helper()
	wf := e.NewWorkflow(org, exWorkflowBody)
	r := e.Do(http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, exStartBody)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	run := r.Map(t)["id"].(string)
	require.Equal(t, models.RunPassed, exExecute(t, e, run))
	l := e.Do(http.MethodGet, "/api/webhook-endpoints/"+endpoint+"/deliveries/", org.Token, nil)
	require.Equal(t, http.StatusOK, l.Status, "%s", l.Body)
	var list handlers.WebhookDeliveryList
	l.JSON(t, &list)
	for _, d := range list.Data {
		if d.RunID != nil && *d.RunID == run {
			return d
		}
	}
	t.Fatalf("no delivery of run %s", run)
	return handlers.WebhookDelivery{}
}

// POST .../deliveries/{id}/redeliver/ makes a delivery due again, whatever
// its status, as a new attempt of the same event; with an Idempotency-Key,
// a retry replays the first answer and asks for nothing more. Another
// organisation's delivery, another endpoint's, or an id that is not a UUID
// is a 404.
func TestWebhookRedeliver(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org, other := e.NewOrg("Acme"), e.NewOrg("Other")
	ep := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"https://example.com/hooks"}`).Map(t)["id"].(string)
	ep2 := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"https://example.com/other"}`).Map(t)["id"].(string)
	d := exDelivery(t, e, org, ep)
	path := "/api/webhook-endpoints/" + ep + "/deliveries/" + d.ID + "/redeliver/"

	for _, status := range []string{models.DeliveryFailed, models.DeliveryDelivered, models.DeliveryPending} {
		require.NoError(t, e.DB.Exec(`UPDATE webhook_deliveries SET status = ?, attempts = 3, next_attempt_at = CASE WHEN ? = 'pending' THEN now() + interval '1 hour' END,
			delivered_at = CASE WHEN ? = 'delivered' THEN now() END WHERE id = ?`, status, status, status, d.ID).Error)
		r := e.Do(http.MethodPost, path, org.Token, nil)
		require.Equal(t, http.StatusAccepted, r.Status, "%s: %s", status, r.Body)
		var got handlers.WebhookDelivery
		r.JSON(t, &got)
		require.Equal(t, d.ID, got.ID)
		require.Equal(t, d.EventID, got.EventID, "the same event: the same webhook-id")
		require.Equal(t, d.RunID, got.RunID)
		require.Equal(t, models.DeliveryPending, got.Status, status)
		require.Equal(t, 3, got.Attempts)
		require.Nil(t, got.DeliveredAt)
		require.NotNil(t, got.NextAttemptAt)
		require.WithinDuration(t, time.Now(), *got.NextAttemptAt, time.Minute, "due now")
	}

	// With a key: the retry replays the first answer and changes nothing.
	require.NoError(t, e.DB.Exec(`UPDATE webhook_deliveries SET status = 'failed', next_attempt_at = NULL WHERE id = ?`, d.ID).Error)
	first := e.Do(http.MethodPost, path, org.Token, nil, idempotency.HeaderKey, "resend-1")
	require.Equal(t, http.StatusAccepted, first.Status, "%s", first.Body)
	require.NoError(t, e.DB.Exec(`UPDATE webhook_deliveries SET status = 'delivered', next_attempt_at = NULL, delivered_at = now() WHERE id = ?`, d.ID).Error)
	again := e.Do(http.MethodPost, path, org.Token, nil, idempotency.HeaderKey, "resend-1")
	require.Equal(t, http.StatusAccepted, again.Status, "%s", again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(first.Body), string(again.Body), "the first answer, byte for byte")
	require.EqualValues(t, 1, e.Count("webhook_deliveries", "id = ? AND status = 'delivered'", d.ID), "the replay asked for no attempt")
	path2 := "/api/webhook-endpoints/" + ep + "/deliveries/" + exDelivery(t, e, org, ep).ID + "/redeliver/"
	reused := e.Do(http.MethodPost, path2, org.Token, nil, idempotency.HeaderKey, "resend-1")
	require.Equal(t, http.StatusUnprocessableEntity, reused.Status, "%s", reused.Body)
	require.Equal(t, "idempotency_key_reused", reused.Map(t)["code"])
	k := e.Do(http.MethodGet, "/api/idempotency-keys/"+handlers.ScopeWebhookResend+"/resend-1", org.Token, nil)
	require.Equal(t, http.StatusOK, k.Status, "%s", k.Body)

	// Not found: another organisation's, another endpoint's, not UUIDs.
	otherEP := e.Do(http.MethodPost, "/api/webhook-endpoints/", other.Token, `{"url":"https://example.com/o"}`).Map(t)["id"].(string)
	for _, c := range []struct {
		token, path string
	}{
		{other.Token, path},
		{other.Token, "/api/webhook-endpoints/" + otherEP + "/deliveries/" + d.ID + "/redeliver/"},
		{org.Token, "/api/webhook-endpoints/" + ep2 + "/deliveries/" + d.ID + "/redeliver/"},
		{org.Token, "/api/webhook-endpoints/" + ep + "/deliveries/" + models.NewRunID() + "/redeliver/"},
		{org.Token, "/api/webhook-endpoints/" + ep + "/deliveries/nope/redeliver/"},
		{org.Token, "/api/webhook-endpoints/nope/deliveries/" + d.ID + "/redeliver"},
	} {
		r := e.Do(http.MethodPost, c.path, c.token, nil)
		require.Equal(t, http.StatusNotFound, r.Status, "%s: %s", c.path, r.Body)
		require.Equal(t, "not_found", r.Map(t)["code"])
	}
	require.EqualValues(t, 1, e.Count("webhook_deliveries", "id = ? AND status = 'delivered'", d.ID), "a 404 touched nothing")
}

// POST /api/webhook-endpoints/{id}/test/ records a webhook.test event for
// the endpoint (whatever it subscribes to), listed with its deliveries;
// with an Idempotency-Key, a retry replays the answer and records no second
// event; at most 5 wait for their attempt (429 test_events_pending).
// Another organisation's endpoint is a 404.
func TestWebhookTestEvent(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org, other := e.NewOrg("Acme"), e.NewOrg("Other")
	ep := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"https://example.com/hooks"}`).Map(t)["id"].(string)
	path := "/api/webhook-endpoints/" + ep + "/test/"

	r := e.Do(http.MethodPost, path, org.Token, nil, idempotency.HeaderKey, "test-1")
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	var d handlers.WebhookDelivery
	r.JSON(t, &d)
	require.Equal(t, models.EventTest, d.EventType)
	require.Nil(t, d.RunID, "about no run")
	require.NotContains(t, r.Map(t), "run_id")
	require.Equal(t, models.DeliveryPending, d.Status)
	require.True(t, strings.HasPrefix(d.EventID, "evt_"), d.EventID)
	require.NotNil(t, d.NextAttemptAt)

	again := e.Do(http.MethodPost, path, org.Token, nil, idempotency.HeaderKey, "test-1")
	require.Equal(t, http.StatusAccepted, again.Status, "%s", again.Body)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, string(r.Body), string(again.Body))
	require.EqualValues(t, 1, e.Count("webhook_deliveries", "endpoint_id = ?", ep), "one event for the key")

	l := e.Do(http.MethodGet, "/api/webhook-endpoints/"+ep+"/deliveries/", org.Token, nil)
	require.Equal(t, http.StatusOK, l.Status, "%s", l.Body)
	var list handlers.WebhookDeliveryList
	l.JSON(t, &list)
	require.Equal(t, []handlers.WebhookDelivery{d}, list.Data)

	// Bounded: 5 wait at once.
	for range 4 {
		r := e.Do(http.MethodPost, path, org.Token, nil)
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	}
	full := e.Do(http.MethodPost, path, org.Token, nil, idempotency.HeaderKey, "test-full")
	require.Equal(t, http.StatusTooManyRequests, full.Status, "%s", full.Body)
	require.Equal(t, "test_events_pending", full.Map(t)["code"])
	require.EqualValues(t, 5, e.Count("webhook_deliveries", "endpoint_id = ?", ep))
	require.NoError(t, e.DB.Exec(`UPDATE webhook_deliveries SET status = 'delivered', next_attempt_at = NULL, delivered_at = now() WHERE endpoint_id = ?`, ep).Error)
	replayed := e.Do(http.MethodPost, path, org.Token, nil, idempotency.HeaderKey, "test-full")
	require.Equal(t, http.StatusTooManyRequests, replayed.Status, "a stored answer, replayed: %s", replayed.Body)
	require.Equal(t, "true", replayed.Header.Get("Idempotent-Replayed"))
	require.Equal(t, http.StatusAccepted, e.Do(http.MethodPost, path, org.Token, nil).Status, "sent: room again")

	// Not found.
	for _, c := range []struct{ token, path string }{
		{other.Token, path},
		{org.Token, "/api/webhook-endpoints/" + models.NewRunID() + "/test/"},
		{org.Token, "/api/webhook-endpoints/nope/test"},
	} {
		r := e.Do(http.MethodPost, c.path, c.token, nil)
		require.Equal(t, http.StatusNotFound, r.Status, "%s: %s", c.path, r.Body)
		require.Equal(t, "not_found", r.Map(t)["code"])
	}
	require.EqualValues(t, 0, e.Count("webhook_deliveries", "org_id = ?", other.ID))
}

// A key reused on a body-less route for another endpoint or delivery is a
// 422 that names the path, the part of the request that differs, not the
// body (there is none).
func TestWebhookReusedKeyNamesThePath(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("acme")
	var eps []string
	for range 2 {
		r := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, `{"url":"https://example.com/hooks"}`)
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		eps = append(eps, r.Map(t)["id"].(string))
	}
	var deliveries []string
	for range 2 {
		r := e.Do(http.MethodPost, "/api/webhook-endpoints/"+eps[0]+"/test/", org.Token, nil)
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		deliveries = append(deliveries, r.Map(t)["id"].(string))
	}
	for _, tt := range []struct {
		name, first, again string
		status             int
	}{
		{"test event", "/api/webhook-endpoints/" + eps[0] + "/test/", "/api/webhook-endpoints/" + eps[1] + "/test/", http.StatusAccepted},
		{"rotate", "/api/webhook-endpoints/" + eps[0] + "/rotate-secret/", "/api/webhook-endpoints/" + eps[1] + "/rotate-secret/", http.StatusOK},
		{"redeliver", "/api/webhook-endpoints/" + eps[0] + "/deliveries/" + deliveries[0] + "/redeliver/",
			"/api/webhook-endpoints/" + eps[0] + "/deliveries/" + deliveries[1] + "/redeliver/", http.StatusAccepted},
	} {
		key := "reused-" + tt.name
		first := e.Do(http.MethodPost, tt.first, org.Token, nil, idempotency.HeaderKey, key)
		require.Equal(t, tt.status, first.Status, "%s: %s", tt.name, first.Body)
		again := e.Do(http.MethodPost, tt.again, org.Token, nil, idempotency.HeaderKey, key)
		p := requireProblem(t, again, http.StatusUnprocessableEntity, "idempotency_key_reused")
		require.Equal(t, "Idempotency key has already been used with a different request path.", p["detail"], tt.name)
	}
}
