package tasks_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/tasks"
	"github.com/valruns/valruns/webhooks"
)

// hookAttempt is one POST a receiver got.
type hookAttempt struct {
	ID, Timestamp, Signature string
	Body                     []byte
}

// hookReceiver is a real HTTP server that records every attempt and answers
// what answer says for the n-th (from 1).
type hookReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	attempts []hookAttempt
	answer   func(n int) int
}

func newHookReceiver(t *testing.T, answer func(n int) int) *hookReceiver {
	t.Helper()
	rc := &hookReceiver{answer: answer}
	rc.Server = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.Close)
	return rc
}

// serve records each webhook delivery (a POST) and answers it. Anything
// else is not ours: a parallel test that took a free port (proctest.FreePort)
// for a process that has not bound it yet polls it (GET /readyz), and may
// reach a receiver that bound that port meanwhile.
func (rc *hookReceiver) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.attempts = append(rc.attempts, hookAttempt{ID: r.Header.Get("webhook-id"), Timestamp: r.Header.Get("webhook-timestamp"),
		Signature: r.Header.Get("webhook-signature"), Body: body})
	n := len(rc.attempts)
	rc.mu.Unlock()
	w.WriteHeader(rc.answer(n))
}

func (rc *hookReceiver) got() []hookAttempt {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]hookAttempt(nil), rc.attempts...)
}

// hookEnv is an API that lets endpoints point at loopback (the receivers
// are local), an organisation, its workflow, and a worker that sends
// webhooks with short delays (edit adjusts it further).
func hookEnv(t *testing.T, edit func(*tasks.Config)) (*apitest.Env, apitest.Org, string, *testWorker) {
	t.Helper()
	env := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.WebhookAllowPrivateTargets = true }})
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := startWorker(t, env, newRedis(t), func(c *tasks.Config) {
		c.WebhookAllowPrivate = true
		c.WebhookPollInterval = 50 * time.Millisecond
		c.WebhookRetryBase = 50 * time.Millisecond
		if edit != nil {
			edit(c)
		}
	})
	return env, org, wf, w
}

type createdEndpoint struct {
	ID     string `json:"id"`
	Secret string `json:"secret"`
}

func createEndpoint(t *testing.T, env *apitest.Env, org apitest.Org, url string) createdEndpoint {
	t.Helper()
	r := env.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, map[string]any{"url": url})
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	var e createdEndpoint
	r.JSON(t, &e)
	return e
}

// apiDelivery is a delivery as the API lists it.
type apiDelivery struct {
	EventID        string     `json:"event_id"`
	RunID          string     `json:"run_id"`
	Status         string     `json:"status"`
	Attempts       int        `json:"attempts"`
	LastStatusCode *int       `json:"last_status_code"`
	LastError      *string    `json:"last_error"`
	NextAttemptAt  *time.Time `json:"next_attempt_at"`
	DeliveredAt    *time.Time `json:"delivered_at"`
}

func deliveries(t *testing.T, env *apitest.Env, org apitest.Org, endpointID string) []apiDelivery {
	t.Helper()
	r := env.Do(http.MethodGet, "/api/webhook-endpoints/"+endpointID+"/deliveries/?limit=100", org.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var page struct {
		Data []apiDelivery `json:"data"`
	}
	r.JSON(t, &page)
	return page.Data
}

// waitDeliveries waits until every delivery of the endpoint has left
// pending and there are n of them.
func waitDeliveries(t *testing.T, env *apitest.Env, org apitest.Org, endpointID string, n int) []apiDelivery {
	t.Helper()
	var ds []apiDelivery
	apitest.Eventually(t, time.Minute, func() bool {
		ds = deliveries(t, env, org, endpointID)
		if len(ds) != n {
			return false
		}
		for _, d := range ds {
			if d.Status == "pending" {
				return false
			}
		}
		return true
	}, "the endpoint's deliveries are done")
	return ds
}

// waitAttempts waits until the endpoint's one delivery has had n attempts
// or more, and returns it.
func waitAttempts(t *testing.T, env *apitest.Env, org apitest.Org, endpointID string, n int) apiDelivery {
	t.Helper()
	var d apiDelivery
	apitest.Eventually(t, time.Minute, func() bool {
		ds := deliveries(t, env, org, endpointID)
		if len(ds) == 1 {
			d = ds[0]
		}
		return len(ds) == 1 && d.Attempts >= n
	}, "the delivery's attempts are made")
	return d
}

// requireSigned fails unless the attempt carries a valid signature by
// every secret in want, and by no other.
func requireSigned(t *testing.T, a hookAttempt, want ...string) {
	t.Helper()
	ts, err := strconv.ParseInt(a.Timestamp, 10, 64)
	require.NoError(t, err, "webhook-timestamp")
	expect, err := webhooks.Sign(want, a.ID, ts, a.Body)
	require.NoError(t, err)
	require.Equal(t, expect, a.Signature, "webhook-signature")
}

// event is a delivery's body.
type event struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"created_at"`
	Data      struct {
		ID       string    `json:"id"`
		Status   string    `json:"status"`
		Findings []finding `json:"findings"`
	} `json:"data"`
}

// A receiver that fails twice, then answers 200, gets three attempts of one
// event: the same webhook-id each time, each validly signed, the body the
// run as the API shows it; the delivery ends delivered after 3 attempts.
func TestWebhookDeliveredAfterTwoFailures(t *testing.T) {
	t.Parallel()
	env, org, wf, w := hookEnv(t, nil)
	rc := newHookReceiver(t, func(n int) int {
		if n <= 2 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	ep := createEndpoint(t, env, org, rc.URL+"/hooks")
	runID := startRun(t, env, org, wf, invalidOrder)
	run := waitRun(t, env, org, runID, 30*time.Second)

	ds := waitDeliveries(t, env, org, ep.ID, 1)
	d := ds[0]
	require.Equal(t, "delivered", d.Status)
	require.Equal(t, 3, d.Attempts)
	require.NotNil(t, d.LastStatusCode)
	require.Equal(t, 200, *d.LastStatusCode)
	require.NotNil(t, d.DeliveredAt)
	require.Nil(t, d.NextAttemptAt)
	require.Equal(t, runID, d.RunID)
	require.Equal(t, "evt_"+strings.ReplaceAll(runID, "-", ""), d.EventID)

	got := rc.got()
	require.Len(t, got, 3, "two failures and the success")
	for _, a := range got {
		require.Equal(t, d.EventID, a.ID, "the same webhook-id on every attempt")
		requireSigned(t, a, ep.Secret)
		var ev event
		require.NoError(t, json.Unmarshal(a.Body, &ev))
		require.Equal(t, d.EventID, ev.ID)
		require.Equal(t, "validation_run.finished", ev.Type)
		require.Equal(t, runID, ev.Data.ID)
		require.Equal(t, run.Status, ev.Data.Status)
		require.Equal(t, invalidOrderFindings, ev.Data.Findings, "the event's run has its findings")
	}
	eventuallyMetric(t, w.Registry, 1, "valruns_webhook_attempts_total", "outcome", "delivered")
	eventuallyMetric(t, w.Registry, 2, "valruns_webhook_attempts_total", "outcome", "retried")
	eventuallyMetric(t, w.Registry, 3, "valruns_tasks_processed_total", "type", tasks.TypeWebhookDeliver)
}

// A receiver that is down (nothing listens) for the first attempts, then
// comes back, gets the event: the delivery is delivered. The receiver's
// port is held throughout by a socket bound but not listening (so a
// connection to it is refused), which then listens: a port released and
// bound again could be taken meanwhile by a parallel test.
func TestWebhookReceiverDownThenUp(t *testing.T) {
	t.Parallel()
	env, org, wf, _ := hookEnv(t, nil)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	sock := os.NewFile(uintptr(fd), "receiver")
	t.Cleanup(func() { _ = sock.Close() })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)) // down: connections are refused
	ep := createEndpoint(t, env, org, "http://"+addr+"/hooks")
	runID := startRun(t, env, org, wf, validOrder)
	waitRun(t, env, org, runID, 30*time.Second)

	down := waitAttempts(t, env, org, ep.ID, 3)
	require.Equal(t, "pending", down.Status)
	require.NotNil(t, down.LastError, "a refused connection is recorded")
	require.Equal(t, webhooks.ReasonRefused, *down.LastError, "without the address")
	require.Nil(t, down.LastStatusCode)
	require.NotNil(t, down.NextAttemptAt)

	rc := &hookReceiver{answer: func(int) int { return http.StatusNoContent }}
	require.NoError(t, syscall.Listen(fd, 128)) // up, on the port it held
	l2, err := net.FileListener(sock)
	require.NoError(t, err)
	rc.Server = &httptest.Server{Listener: l2, Config: &http.Server{Handler: http.HandlerFunc(rc.serve)}}
	rc.Start()
	t.Cleanup(rc.Close)

	d := waitDeliveries(t, env, org, ep.ID, 1)[0]
	require.Equal(t, "delivered", d.Status)
	require.Greater(t, d.Attempts, down.Attempts)
	got := rc.got()
	require.NotEmpty(t, got)
	for _, a := range got {
		require.Equal(t, d.EventID, a.ID)
		requireSigned(t, a, ep.Secret)
	}
}

// An attempt whose outcome could not be recorded (the database refused the
// write) leaves its asynq task archived, since an attempt has no retries
// of its own: once its claim runs out, the delivery is claimed and
// attempted again with the same webhook-id, and ends delivered.
func TestWebhookAttemptRedoneAfterItsOutcomeWasLost(t *testing.T) {
	t.Parallel()
	env, org, wf, _ := hookEnv(t, func(c *tasks.Config) { c.WebhookClaimLease = 300 * time.Millisecond })
	// The first write of an attempt's outcome fails; later ones go through
	// (a sequence is not rolled back with the failed statement).
	require.NoError(t, env.DB.Exec(`CREATE SEQUENCE lose_outcome`).Error)
	require.NoError(t, env.DB.Exec(`CREATE FUNCTION lose_first_outcome() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.attempts > OLD.attempts THEN
		IF nextval('lose_outcome') = 1 THEN
			RAISE EXCEPTION 'injected: the outcome of the first attempt is not written';
		END IF;
	END IF;
	RETURN NEW;
END $$`).Error)
	require.NoError(t, env.DB.Exec(`CREATE TRIGGER lose_first_outcome BEFORE UPDATE ON webhook_deliveries
		FOR EACH ROW EXECUTE FUNCTION lose_first_outcome()`).Error)
	rc := newHookReceiver(t, func(int) int { return http.StatusOK })
	ep := createEndpoint(t, env, org, rc.URL)
	startRun(t, env, org, wf, validOrder)

	d := waitDeliveries(t, env, org, ep.ID, 1)[0]
	require.Equal(t, "delivered", d.Status)
	var lost int64
	require.NoError(t, env.DB.Raw(`SELECT last_value FROM lose_outcome`).Scan(&lost).Error)
	require.GreaterOrEqual(t, lost, int64(2), "the first outcome was lost, a later one written")
	got := rc.got()
	require.GreaterOrEqual(t, len(got), 2, "the attempt whose outcome was lost is made again")
	for _, a := range got {
		require.Equal(t, d.EventID, a.ID, "the same webhook-id on every attempt")
		requireSigned(t, a, ep.Secret)
	}
}

// A delivery that never gets a 2xx ends failed once its horizon has
// passed: no next attempt.
func TestWebhookGivesUpPastItsHorizon(t *testing.T) {
	t.Parallel()
	env, org, wf, w := hookEnv(t, func(c *tasks.Config) { c.WebhookRetryHorizon = 300 * time.Millisecond })
	rc := newHookReceiver(t, func(int) int { return http.StatusServiceUnavailable })
	ep := createEndpoint(t, env, org, rc.URL)
	startRun(t, env, org, wf, validOrder)

	d := waitDeliveries(t, env, org, ep.ID, 1)[0]
	require.Equal(t, "failed", d.Status)
	require.Nil(t, d.NextAttemptAt)
	require.Nil(t, d.DeliveredAt)
	require.NotNil(t, d.LastStatusCode)
	require.Equal(t, http.StatusServiceUnavailable, *d.LastStatusCode)
	require.Len(t, rc.got(), d.Attempts, "each attempt reached the receiver")
	eventuallyMetric(t, w.Registry, 1, "valruns_webhook_attempts_total", "outcome", "failed")
}

// A worker that does not allow private targets refuses to connect to a
// loopback endpoint (made while they were allowed), whatever name it
// has: the attempt fails without reaching the receiver.
func TestWebhookPrivateTargetRefusedAtSend(t *testing.T) {
	t.Parallel()
	env, org, wf, _ := hookEnv(t, func(c *tasks.Config) { c.WebhookAllowPrivate = false })
	rc := newHookReceiver(t, func(int) int { return http.StatusOK })
	_, port, err := net.SplitHostPort(rc.Listener.Addr().String())
	require.NoError(t, err)
	ep := createEndpoint(t, env, org, "http://localhost:"+port+"/hooks")
	startRun(t, env, org, wf, validOrder)

	d := waitAttempts(t, env, org, ep.ID, 2)
	require.Equal(t, "pending", d.Status)
	require.NotNil(t, d.LastError)
	require.Equal(t, webhooks.ReasonNotAllowed, *d.LastError, "a coarse reason, never the address the name resolved to")
	require.Empty(t, rc.got(), "no attempt reached the loopback receiver")
}

// After a rotation both secrets sign, the new one first; once the old
// one's overlap has ended, only the new one does.
func TestWebhookRotationSignsWithBothSecretsDuringTheOverlap(t *testing.T) {
	t.Parallel()
	env, org, wf, _ := hookEnv(t, nil)
	rc := newHookReceiver(t, func(int) int { return http.StatusOK })
	ep := createEndpoint(t, env, org, rc.URL)
	r := env.Do(http.MethodPost, "/api/webhook-endpoints/"+ep.ID+"/rotate-secret/", org.Token, nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	var rotated createdEndpoint
	r.JSON(t, &rotated)
	require.NotEqual(t, ep.Secret, rotated.Secret)

	startRun(t, env, org, wf, validOrder)
	waitDeliveries(t, env, org, ep.ID, 1)
	got := rc.got()
	require.Len(t, got, 1)
	requireSigned(t, got[0], rotated.Secret, ep.Secret)

	// The overlap ends.
	require.NoError(t, env.DB.Exec(`UPDATE webhook_endpoints SET previous_secret_expires_at = now() - interval '1 second' WHERE id = ?`, ep.ID).Error)
	startRun(t, env, org, wf, validOrder)
	waitDeliveries(t, env, org, ep.ID, 2)
	got = rc.got()
	require.Len(t, got, 2)
	requireSigned(t, got[1], rotated.Secret)
}

// The event is recorded with the run's final state, not by the worker that
// sends it: runs finished by a worker that sends no webhooks (as a worker
// killed right after its final write would) are delivered by another.
func TestWebhookOutboxOutlivesTheWorkerThatEndedTheRun(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.WebhookAllowPrivateTargets = true }})
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	rc := newHookReceiver(t, func(int) int { return http.StatusOK })
	ep := createEndpoint(t, env, org, rc.URL)
	redis := newRedis(t)
	quiet := startWorker(t, env, redis, func(c *tasks.Config) { c.WebhookConcurrency = -1 })
	var ids []string
	for range 5 {
		ids = append(ids, startRun(t, env, org, wf, validOrder))
	}
	for _, id := range ids {
		waitRun(t, env, org, id, 30*time.Second)
	}
	quiet.Stop()
	require.EqualValues(t, 5, env.Count("webhook_deliveries", "endpoint_id = ? AND status = 'pending' AND attempts = 0", ep.ID),
		"each final run recorded its event, and nothing sent it")
	require.Empty(t, rc.got())

	startWorker(t, env, redis, func(c *tasks.Config) {
		c.WebhookAllowPrivate, c.WebhookPollInterval = true, 50*time.Millisecond
	})
	ds := waitDeliveries(t, env, org, ep.ID, 5)
	seen := map[string]bool{}
	for _, d := range ds {
		require.Equal(t, "delivered", d.Status)
		seen[d.RunID] = true
	}
	require.Len(t, seen, 5)
	require.Len(t, rc.got(), 5, "each event once")
}

// A slow endpoint holds at most a few of the worker's senders: another
// organisation's endpoint gets its events while the slow one's attempts
// hang.
func TestWebhookSlowEndpointHoldsAFewSenders(t *testing.T) {
	t.Parallel()
	env, org, wf, _ := hookEnv(t, func(c *tasks.Config) { c.WebhookConcurrency = 8 })
	release := make(chan struct{})
	var mu sync.Mutex
	inFlight, most := 0, 0
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // read whole: from here on, the sender's hang-up ends r.Context()
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		select {
		case <-release:
		case <-r.Context().Done(): // the sender gave up (webhooks.Timeout) and hung up: no longer under way
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	createEndpoint(t, env, org, slow.URL)
	for range 12 {
		startRun(t, env, org, wf, validOrder)
	}

	other := env.NewOrg("globex")
	owf := env.NewWorkflow(other, orderWorkflow)
	fast := newHookReceiver(t, func(int) int { return http.StatusOK })
	fep := createEndpoint(t, env, other, fast.URL)
	for range 6 {
		startRun(t, env, other, owf, validOrder)
	}
	ds := waitDeliveries(t, env, other, fep.ID, 6)
	for _, d := range ds {
		require.Equal(t, "delivered", d.Status)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, most, "the slow endpoint's attempts were under way")
	require.LessOrEqual(t, most, 4, "attempts under way to one endpoint")
}

// The periodic cleanup deletes deliveries delivered or failed past their
// retention, and keeps a pending one, however old, and a recent one.
func TestCleanupDeletesOldDoneDeliveries(t *testing.T) {
	t.Parallel()
	env, org, wf, w := hookEnv(t, nil)
	rc := newHookReceiver(t, func(int) int { return http.StatusOK })
	ep := createEndpoint(t, env, org, rc.URL)
	for range 3 {
		startRun(t, env, org, wf, validOrder)
	}
	ds := waitDeliveries(t, env, org, ep.ID, 3)
	w.Stop() // nothing sends from here on
	old := func(id string) {
		require.NoError(t, env.DB.Exec(`UPDATE webhook_deliveries SET created_at = now() - interval '31 days' WHERE run_id = ?`, id).Error)
	}
	old(ds[0].RunID) // delivered, old: deleted
	old(ds[1].RunID) // old but pending again: kept
	require.NoError(t, env.DB.Exec(`UPDATE webhook_deliveries SET status = 'pending', delivered_at = NULL WHERE run_id = ?`, ds[1].RunID).Error)
	// ds[2]: delivered, recent: kept

	cleaner := newWorker(t, env, idleRedis(), nil)
	require.NoError(t, cleaner.Mux().ProcessTask(context.Background(), asynq.NewTask(tasks.TypeCleanup, nil)))
	left := map[string]bool{}
	for _, d := range deliveries(t, env, org, ep.ID) {
		left[d.RunID] = true
	}
	require.Equal(t, map[string]bool{ds[1].RunID: true, ds[2].RunID: true}, left)
}
