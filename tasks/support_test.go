package tasks_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/tasks"
)

// A delivery that was given up (failed) and is sent again on request gets
// a new attempt of the same event: the receiver sees the same webhook-id
// and the same body, validly signed, and the delivery ends delivered. One
// that was delivered and is sent again is sent again, the same way.
func TestWebhookRedeliveredEndToEnd(t *testing.T) {
	t.Parallel()
	// A horizon shorter than the first retry: the first failure gives up.
	env, org, wf, _ := hookEnv(t, func(c *tasks.Config) { c.WebhookRetryHorizon = time.Millisecond })
	rc := newHookReceiver(t, func(n int) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	ep := createEndpoint(t, env, org, rc.URL+"/hooks")
	runID := startRun(t, env, org, wf, validOrder)
	waitRun(t, env, org, runID, 30*time.Second)
	failed := waitDeliveries(t, env, org, ep.ID, 1)[0]
	require.Equal(t, "failed", failed.Status)
	require.Equal(t, 1, failed.Attempts)

	var id string
	r := env.Do(http.MethodGet, "/api/webhook-endpoints/"+ep.ID+"/deliveries/", org.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var page struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	r.JSON(t, &page)
	id = page.Data[0].ID
	path := "/api/webhook-endpoints/" + ep.ID + "/deliveries/" + id + "/redeliver/"

	redeliver := func(key string) {
		t.Helper()
		r := env.Do(http.MethodPost, path, org.Token, nil, idempotency.HeaderKey, key)
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		require.Equal(t, "pending", r.Map(t)["status"])
	}
	redeliver("again-1")
	d := waitDeliveries(t, env, org, ep.ID, 1)[0]
	require.Equal(t, "delivered", d.Status)
	require.Equal(t, 2, d.Attempts)
	redeliver("again-2") // delivered, and sent once more
	apitest.Eventually(t, time.Minute, func() bool {
		ds := deliveries(t, env, org, ep.ID)
		return ds[0].Status == "delivered" && ds[0].Attempts == 3
	}, "the delivered event is sent again")

	got := rc.got()
	require.Len(t, got, 3)
	for _, a := range got {
		require.Equal(t, failed.EventID, a.ID, "the same webhook-id on every attempt")
		require.Equal(t, string(got[0].Body), string(a.Body), "the same event")
		requireSigned(t, a, ep.Secret)
	}
}

// A test event reaches the endpoint signed like any event, with the type
// webhook.test and the endpoint's id, though the endpoint subscribes only
// to validation_run.finished; it is attempted once: a receiver that fails
// it leaves it failed, with no retry.
func TestWebhookTestEventEndToEnd(t *testing.T) {
	t.Parallel()
	env, org, _, _ := hookEnv(t, nil)
	rc := newHookReceiver(t, func(int) int { return http.StatusNoContent })
	ep := createEndpoint(t, env, org, rc.URL+"/hooks")

	r := env.Do(http.MethodPost, "/api/webhook-endpoints/"+ep.ID+"/test/", org.Token, nil)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	d := waitDeliveries(t, env, org, ep.ID, 1)[0]
	require.Equal(t, "delivered", d.Status)
	require.Equal(t, 1, d.Attempts)
	require.Empty(t, d.RunID)
	got := rc.got()
	require.Len(t, got, 1)
	require.Equal(t, d.EventID, got[0].ID)
	requireSigned(t, got[0], ep.Secret)
	var ev struct {
		ID   string `json:"id"`
		Type string `json:"type"`
		Data struct {
			EndpointID string `json:"endpoint_id"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(got[0].Body, &ev))
	require.Equal(t, d.EventID, ev.ID)
	require.Equal(t, "webhook.test", ev.Type)
	require.Equal(t, ep.ID, ev.Data.EndpointID)

	failing := newHookReceiver(t, func(int) int { return http.StatusInternalServerError })
	ep2 := createEndpoint(t, env, org, failing.URL+"/hooks")
	r = env.Do(http.MethodPost, "/api/webhook-endpoints/"+ep2.ID+"/test/", org.Token, nil)
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	f := waitDeliveries(t, env, org, ep2.ID, 1)[0]
	require.Equal(t, "failed", f.Status, "a test event is attempted once")
	require.Equal(t, 1, f.Attempts)
	require.NotNil(t, f.LastStatusCode)
	require.Equal(t, http.StatusInternalServerError, *f.LastStatusCode)
	require.Len(t, failing.got(), 1)
}
