package clienttest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/client"
	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
)

// These tests run the client against the real API (the real router on a
// fresh PostgreSQL database, served on loopback). Only the network between
// them is faked, by faultTransport; and the client module's own tests
// (client/retry_test.go) use a handler of their own for the answers the real
// server cannot be made to give on demand.

// server is the API under test with an organisation, a workflow and a
// count of the requests that reached the API.
type server struct {
	env  *apitest.Env
	org  apitest.Org
	wf   string
	url  string
	hits atomic.Int64
}

func newServer(t *testing.T, cfg func(*config.Config)) *server {
	t.Helper()
	return newServerWith(t, apitest.Options{Config: cfg})
}

// newServerWith is newServer with the harness's options (a tracer).
func newServerWith(t *testing.T, o apitest.Options) *server {
	t.Helper()
	o.MaxOpenConns = 40
	s := &server{env: apitest.New(t, o)}
	s.org = s.env.NewOrg("client")
	s.wf = s.env.NewWorkflow(s.org, map[string]any{"name": "client"})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		s.env.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *server) client(opts ...client.Option) *client.Client {
	return client.New(s.url, s.org.Token, opts...)
}

// TestStartRunUnderFaults: 1,000 logical starts, 24 at a time, through a
// network that resets connections before and after the server processed
// the request, cuts answers short, hangs up while the server works, and
// answers 503 on its own. Exactly 1,000 runs exist, each call got the run
// of its own key (the key row's validation_run_id) and its own body, and
// every attempt of a call sent the same key with the identical body.
func TestStartRunUnderFaults(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = 32
	ft := newFaultTransport(base, 20261122, [numFaults]float64{
		faultResetBefore: 0.08, fault503: 0.08, faultDropAfter: 0.10, faultCutBody: 0.05, faultHangUp: 0.04,
	})
	t.Cleanup(ft.pending.Wait)
	c := s.client(
		client.WithHTTPClient(&http.Client{Transport: ft, Timeout: 30 * time.Second}),
		client.WithMaxAttempts(40), // P(40 faults in a row) is about 1e-17 per call
		client.WithBackoff(time.Millisecond, 20*time.Millisecond),
		// The 409's Retry-After (1 s) is honoured as is: on a loaded machine a
		// hung-up request can stay in flight for a second or more, and 40
		// attempts 1 s apart outlast the server's own transaction timeout.
	)

	const calls, workers = 1000, 24
	results := make([]*client.StartResult, calls)
	errs := make([]error, calls)
	var next atomic.Int64
	var wg sync.WaitGroup
	ctx := t.Context()
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= calls {
					return
				}
				var opts []client.StartOption
				if i%2 == 0 { // half choose their key, half let the client generate one
					opts = append(opts, client.WithKey(fmt.Sprintf("fault-%04d", i)))
				}
				opts = append(opts, client.WithMetadata(map[string]int{"call": i}))
				results[i], errs[i] = c.StartRun(ctx, s.wf, map[string]any{"call": i, "total": 42}, opts...)
			}
		})
	}
	wg.Wait()
	ft.pending.Wait() // the hung-up requests have finished on the server

	for i, err := range errs {
		require.NoError(t, err, "call %d", i)
	}
	require.EqualValues(t, calls, s.env.Count("validation_runs", ""), "exactly one run per logical start")
	require.EqualValues(t, calls, s.env.Count("idempotency_keys", "endpoint = 'workflow_start'"))

	var rows []struct {
		Key             string
		ValidationRunID string
		Call            int
	}
	require.NoError(t, s.env.DB.Raw(`SELECT k.key, k.validation_run_id, (r.submission->>'call')::int AS call
		FROM idempotency_keys k JOIN validation_runs r ON r.id = k.validation_run_id
		WHERE k.endpoint = 'workflow_start'`).Scan(&rows).Error)
	require.Len(t, rows, calls)
	byKey := map[string]string{}
	callOfRun := map[string]int{}
	for _, r := range rows {
		byKey[r.Key] = r.ValidationRunID
		callOfRun[r.ValidationRunID] = r.Call
	}

	var replayed, retried int
	for i, res := range results {
		if i%2 == 0 {
			require.Equal(t, fmt.Sprintf("fault-%04d", i), res.Key)
		} else {
			require.NoError(t, uuid.Validate(res.Key), "generated key %q", res.Key)
		}
		require.Equal(t, byKey[res.Key], res.Run.ID, "call %d got the run of its own key", i)
		require.Equal(t, i, callOfRun[res.Run.ID], "the run of call %d holds its submission", i)
		var sub struct{ Call int }
		require.NoError(t, json.Unmarshal(res.Run.Submission, &sub))
		require.Equal(t, i, sub.Call)
		require.NotEmpty(t, res.RequestID)
		if res.Replayed {
			replayed++
			require.NotEmpty(t, res.OriginalRequestID)
		}
		if res.Attempts > 1 {
			retried++
		}
		ft.mu.Lock()
		require.Len(t, ft.bodies[res.Key], 1, "call %d: every attempt sent the identical body", i)
		require.Equal(t, res.Attempts, ft.tries[res.Key], "call %d: attempts counted by the client and the network", i)
		ft.mu.Unlock()
	}
	for f := faultNone + 1; f < numFaults; f++ {
		require.Positive(t, ft.fired[f].Load(), "fault %q never fired", faultNames[f])
		t.Logf("%-34s %d", faultNames[f], ft.fired[f].Load())
	}
	t.Logf("calls retried: %d, answered by a replay: %d, 409s from the server: %d", retried, replayed, ft.conflicts.Load())
	require.Positive(t, replayed, "answers lost after processing must come back as replays")
}

// TestCreateWorkflowUnderFaults: CreateWorkflow is idempotent the same way:
// 100 creates through the faulty network make 100 workflows.
func TestCreateWorkflowUnderFaults(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	ft := newFaultTransport(http.DefaultTransport, 7, [numFaults]float64{
		faultResetBefore: 0.1, fault503: 0.1, faultDropAfter: 0.15, faultCutBody: 0.1,
	})
	c := s.client(client.WithHTTPClient(&http.Client{Transport: ft}), client.WithMaxAttempts(40),
		client.WithBackoff(time.Millisecond, 10*time.Millisecond))
	var wg sync.WaitGroup
	errs := make([]error, 100)
	for i := range 100 {
		wg.Go(func() {
			res, err := c.CreateWorkflow(t.Context(), client.NewWorkflow{
				Name:       fmt.Sprintf("wf-%d", i),
				Assertions: []client.Assertion{{Name: "positive", Expr: "submission.total > 0", Severity: "error"}},
			})
			if err == nil && res.Workflow.Name != fmt.Sprintf("wf-%d", i) {
				err = fmt.Errorf("got workflow %q", res.Workflow.Name)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "create %d", i)
	}
	require.EqualValues(t, 101, s.env.Count("workflows", ""), "100 creates and the fixture's workflow")
	require.Positive(t, ft.fired[faultDropAfter].Load())
}

// TestIdempotentReplay: the same key twice is one run, and the second
// answer says it is a replay; CreateWorkflow likewise.
func TestIdempotentReplay(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	c := s.client()
	ctx := t.Context()
	first, err := c.StartRun(ctx, s.wf, json.RawMessage(`{"total": 42}`), client.WithKey("order-1042"))
	require.NoError(t, err)
	require.False(t, first.Replayed)
	require.Equal(t, client.StatusQueued, first.Run.Status)
	require.Equal(t, 1, first.Attempts)
	again, err := c.StartRun(ctx, s.wf, map[string]any{"total": 42.0}, client.WithKey("order-1042"))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Run.ID, again.Run.ID)
	require.Equal(t, first.RequestID, again.OriginalRequestID)
	require.EqualValues(t, 1, s.env.Count("validation_runs", ""))
	// Raw is the answer as sent: a replay is the first answer byte for
	// byte, and a queued run has no findings field.
	require.Equal(t, string(first.Run.Raw), string(again.Run.Raw))
	require.NotContains(t, string(first.Run.Raw), "findings")
	read, err := c.GetRun(ctx, first.Run.ID)
	require.NoError(t, err)
	var fields map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(read.Raw, &fields))
	require.Equal(t, first.Run.ID, strings.Trim(string(fields["id"]), `"`))

	w1, err := c.CreateWorkflow(ctx, client.NewWorkflow{Name: "twice"}, client.WithKey("wf-twice"))
	require.NoError(t, err)
	w2, err := c.CreateWorkflow(ctx, client.NewWorkflow{Name: "twice"}, client.WithKey("wf-twice"))
	require.NoError(t, err)
	require.False(t, w1.Replayed)
	require.True(t, w2.Replayed)
	require.Equal(t, w1.Workflow.ID, w2.Workflow.ID)
	got, err := c.GetWorkflow(ctx, w1.Workflow.ID)
	require.NoError(t, err)
	require.Equal(t, "twice", got.Name)

	// Without WithKey, every call is a new operation with a new key.
	a, err := c.StartRun(ctx, s.wf, map[string]any{"total": 1})
	require.NoError(t, err)
	b, err := c.StartRun(ctx, s.wf, map[string]any{"total": 1})
	require.NoError(t, err)
	require.NotEqual(t, a.Key, b.Key)
	require.NotEqual(t, a.Run.ID, b.Run.ID)
	require.EqualValues(t, 3, s.env.Count("validation_runs", ""))
}

// TestFinalAnswersAreNotRetried: each answer that is not worth retrying is
// one request to the server and a typed *Error with the problem document.
func TestFinalAnswersAreNotRetried(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(c *config.Config) { c.DefaultMonthlyRunQuota = 3 })
	c := s.client(client.WithBackoff(time.Millisecond, time.Millisecond))
	ctx := t.Context()
	_, err := c.StartRun(ctx, s.wf, map[string]any{"total": 1}, client.WithKey("used"))
	require.NoError(t, err)

	tests := []struct {
		name     string
		call     func() error
		status   int
		code     string
		sentinel error
		replayed bool
	}{
		{"422 key reused with another body", func() error {
			_, err := c.StartRun(ctx, s.wf, map[string]any{"total": 2}, client.WithKey("used"))
			return err
		}, 422, "idempotency_key_reused", client.ErrKeyReused, false},
		{"400 metadata not an object", func() error {
			_, err := c.StartRun(ctx, s.wf, 1, client.WithMetadata([]int{1}))
			return err
		}, 400, "validation_error", nil, false},
		{"400 key too long", func() error {
			_, err := c.StartRun(ctx, s.wf, 1, client.WithKey(strings.Repeat("k", 256)))
			return err
		}, 400, "idempotency_key_too_long", nil, false},
		{"400 workflow that does not compile", func() error {
			_, err := c.CreateWorkflow(ctx, client.NewWorkflow{Name: "bad", Assertions: []client.Assertion{{Name: "x", Expr: "submission.total >"}}})
			return err
		}, 400, "invalid_workflow", nil, false},
		{"401 unknown token on a start", func() error {
			_, err := client.New(s.url, "vr_nope").StartRun(ctx, s.wf, 1)
			return err
		}, 401, "invalid_token", client.ErrUnauthorized, false},
		{"401 no token on a read", func() error {
			_, err := client.New(s.url, "").GetWorkflow(ctx, s.wf)
			return err
		}, 401, "unauthenticated", client.ErrUnauthorized, false},
		{"404 unknown workflow", func() error {
			_, err := c.StartRun(ctx, uuid.NewString(), 1, client.WithKey("unknown-wf"))
			return err
		}, 404, "not_found", client.ErrNotFound, false},
		{"422 same key on another workflow", func() error {
			_, err := c.StartRun(ctx, uuid.NewString(), 1, client.WithKey("unknown-wf"))
			return err
		}, 422, "idempotency_key_reused", client.ErrKeyReused, false},
		{"404 unknown run", func() error {
			_, err := c.GetRun(ctx, uuid.NewString())
			return err
		}, 404, "not_found", client.ErrNotFound, false},
	}
	for _, tt := range tests {
		before := s.hits.Load()
		err := tt.call()
		require.Error(t, err, tt.name)
		var e *client.Error
		require.ErrorAs(t, err, &e, tt.name)
		require.Equal(t, tt.status, e.Status, "%s: %v", tt.name, err)
		require.Equal(t, tt.code, e.Code, tt.name)
		require.NotEmpty(t, e.Detail, tt.name)
		require.NotEmpty(t, e.Title, tt.name)
		require.Equal(t, "/problems/"+tt.code, e.Type, tt.name)
		require.NotEmpty(t, e.RequestID, tt.name)
		require.Equal(t, tt.replayed, e.Replayed, tt.name)
		if tt.sentinel != nil {
			require.ErrorIs(t, err, tt.sentinel, tt.name)
		}
		for _, other := range []error{client.ErrKeyReused, client.ErrQuotaExceeded, client.ErrNotFound, client.ErrUnauthorized} {
			if other != tt.sentinel {
				require.NotErrorIs(t, err, other, tt.name)
			}
		}
		require.NotContains(t, err.Error(), "\n")
		require.Contains(t, err.Error(), tt.code)
		require.EqualValues(t, 1, s.hits.Load()-before, "%s: one request, no retry", tt.name)
	}

	// A stored 404 under a key is replayed as the same final answer.
	before := s.hits.Load()
	wf404 := uuid.NewString()
	_, err = c.StartRun(ctx, wf404, 1, client.WithKey("gone"))
	require.ErrorIs(t, err, client.ErrNotFound)
	_, err = c.StartRun(ctx, wf404, 1, client.WithKey("gone"))
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.ErrorIs(t, err, client.ErrNotFound)
	require.True(t, e.Replayed)
	require.EqualValues(t, 2, s.hits.Load()-before)

	// The 400 carries the field errors.
	_, err = c.StartRun(ctx, s.wf, 1, client.WithMetadata([]int{1}))
	require.ErrorAs(t, err, &e)
	require.Equal(t, []client.FieldError{{Field: "metadata", Message: "must be an object"}}, e.Errors)
}

// TestQuotaExceededIsNotRetried: past the quota the start is 429
// quota_exceeded, a stored final answer: one request, ErrQuotaExceeded;
// the same key again is its replay.
func TestQuotaExceededIsNotRetried(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(c *config.Config) { c.DefaultMonthlyRunQuota = 2 })
	c := s.client(client.WithBackoff(time.Millisecond, time.Millisecond), client.WithMaxAttempts(10))
	ctx := t.Context()
	for i := range 2 {
		_, err := c.StartRun(ctx, s.wf, map[string]int{"i": i})
		require.NoError(t, err)
	}
	before := s.hits.Load()
	_, err := c.StartRun(ctx, s.wf, map[string]int{"i": 3}, client.WithKey("over"))
	require.ErrorIs(t, err, client.ErrQuotaExceeded)
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, http.StatusTooManyRequests, e.Status)
	require.False(t, e.Replayed)
	require.EqualValues(t, 1, s.hits.Load()-before, "quota_exceeded is final: one request")

	_, err = c.StartRun(ctx, s.wf, map[string]int{"i": 3}, client.WithKey("over"))
	require.ErrorIs(t, err, client.ErrQuotaExceeded)
	require.ErrorAs(t, err, &e)
	require.True(t, e.Replayed, "the stored 429 is replayed")
	require.EqualValues(t, 2, s.hits.Load()-before)
	require.EqualValues(t, 2, s.env.Count("validation_runs", ""))
}

// TestIterators: ListWorkflows and ListRuns follow next_cursor over several
// pages, newest first, each item once; breaking out stops fetching; the
// workflow filter holds across pages.
func TestIterators(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	c := s.client()
	ctx := t.Context()
	wantWF := []string{s.wf}
	for i := range 6 {
		res, err := c.CreateWorkflow(ctx, client.NewWorkflow{Name: fmt.Sprintf("list-%d", i)})
		require.NoError(t, err)
		wantWF = append(wantWF, res.Workflow.ID)
	}
	other := wantWF[1]
	var wantRuns, wantOther []string
	for i := range 5 {
		res, err := c.StartRun(ctx, s.wf, map[string]int{"i": i})
		require.NoError(t, err)
		wantRuns = append(wantRuns, res.Run.ID)
		if i < 2 {
			res, err := c.StartRun(ctx, other, map[string]int{"i": i})
			require.NoError(t, err)
			wantOther = append(wantOther, res.Run.ID)
			wantRuns = append(wantRuns, res.Run.ID)
		}
	}
	reverse := func(ids []string) []string {
		out := make([]string, len(ids))
		for i, id := range ids {
			out[len(ids)-1-i] = id
		}
		return out
	}

	before := s.hits.Load()
	var gotWF []string
	for w, err := range c.ListWorkflows(ctx, client.WithPageSize(3)) {
		require.NoError(t, err)
		gotWF = append(gotWF, w.ID)
	}
	require.Equal(t, reverse(wantWF), gotWF, "7 workflows, newest first")
	require.EqualValues(t, 3, s.hits.Load()-before, "pages of 3, 3, 1")

	var gotRuns []string
	for r, err := range c.ListRuns(ctx, "", client.WithPageSize(2)) {
		require.NoError(t, err)
		gotRuns = append(gotRuns, r.ID)
	}
	require.Equal(t, reverse(wantRuns), gotRuns)

	var gotMain []string
	for r, err := range c.ListRuns(ctx, s.wf, client.WithPageSize(2)) {
		require.NoError(t, err)
		require.Equal(t, s.wf, r.WorkflowID)
		gotMain = append(gotMain, r.ID)
	}
	require.Len(t, gotMain, 5)
	var gotOther []string
	for r, err := range c.ListRuns(ctx, other) {
		require.NoError(t, err)
		gotOther = append(gotOther, r.ID)
	}
	require.Equal(t, reverse(wantOther), gotOther)

	before = s.hits.Load()
	n := 0
	for _, err := range c.ListRuns(ctx, "", client.WithPageSize(2)) {
		require.NoError(t, err)
		if n++; n == 3 {
			break
		}
	}
	require.EqualValues(t, 2, s.hits.Load()-before, "breaking after 3 items fetched 2 pages")

	// An error ends the iteration with the typed error.
	var errs []error
	for _, err := range c.ListRuns(ctx, "not-a-uuid") {
		errs = append(errs, err)
	}
	require.Len(t, errs, 1)
	var e *client.Error
	require.ErrorAs(t, errs[0], &e)
	require.Equal(t, http.StatusBadRequest, e.Status)
}

// TestWaitRun: WaitRun polls until the run is final and reports each
// status it saw. The worker is played by the test, which moves the run
// through its statuses in the database (the server under test is real).
func TestWaitRun(t *testing.T) {
	t.Parallel()
	s := newServer(t, nil)
	c := s.client()
	ctx := t.Context()
	res, err := c.StartRun(ctx, s.wf, map[string]int{"total": 1})
	require.NoError(t, err)
	id := res.Run.ID

	var mu sync.Mutex
	var seen []string
	progress := func(r client.Run) {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 || seen[len(seen)-1] != r.Status {
			seen = append(seen, r.Status)
		}
	}
	sawStatus := func(st string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) > 0 && seen[len(seen)-1] == st
		}
	}
	type out struct {
		run *client.Run
		err error
	}
	done := make(chan out, 1)
	go func() {
		r, err := c.WaitRun(ctx, id, client.WithProgress(progress), client.WithPollInterval(5*time.Millisecond, 20*time.Millisecond))
		done <- out{r, err}
	}()
	apitest.Eventually(t, 10*time.Second, sawStatus("queued"), "WaitRun reported queued")
	require.NoError(t, s.env.DB.Exec(`UPDATE validation_runs SET status = 'running', started_at = now(), attempts = 1 WHERE id = ?`, id).Error)
	apitest.Eventually(t, 10*time.Second, sawStatus("running"), "WaitRun reported running")
	require.NoError(t, s.env.DB.Exec(`UPDATE validation_runs SET status = 'failed', finished_at = now(),
		findings = '[{"step":"assertion:positive","severity":"error","path":"","message":"total must be positive"}]' WHERE id = ?`, id).Error)
	got := <-done
	require.NoError(t, got.err)
	require.Equal(t, client.StatusFailed, got.run.Status)
	require.True(t, got.run.Final())
	require.Equal(t, []client.Finding{{Step: "assertion:positive", Severity: "error", Message: "total must be positive"}}, got.run.Findings)
	require.Equal(t, []string{"queued", "running", "failed"}, seen)

	// A context that ends first ends the wait with its error.
	res, err = c.StartRun(ctx, s.wf, map[string]int{"total": 2})
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = c.WaitRun(wctx, res.Run.ID, client.WithPollInterval(5*time.Millisecond, 10*time.Millisecond))
	require.ErrorIs(t, err, context.DeadlineExceeded)

	_, err = c.WaitRun(ctx, uuid.NewString())
	require.ErrorIs(t, err, client.ErrNotFound)
}

// TestWaitRunLongPolls: WaitRun asks the server to hold its request until
// the run is final (Prefer: wait), so a run that ends while it waits costs
// one GET, not a poll every few hundred milliseconds. Against a server that
// does not wait (RUN_MAX_WAIT=0), it still polls until the run is final.
func TestWaitRunLongPolls(t *testing.T) {
	t.Parallel()
	type out struct {
		run *client.Run
		err error
	}
	wait := func(s *server, id string) <-chan out {
		done := make(chan out, 1)
		go func() {
			r, err := s.client().WaitRun(t.Context(), id)
			done <- out{r, err}
		}()
		return done
	}
	finish := func(s *server, id string) {
		runs := models.NewRunStore(s.env.DB)
		c, err := runs.Claim(t.Context(), id, time.Minute, 5)
		require.NoError(t, err)
		ok, err := runs.Finish(t.Context(), id, c.Attempts, models.RunPassed, nil)
		require.NoError(t, err)
		require.True(t, ok)
	}
	result := func(done <-chan out) *client.Run {
		select {
		case o := <-done:
			require.NoError(t, o.err)
			return o.run
		case <-time.After(2 * time.Minute): // a bound, far above the 30 s a request may wait
			t.Fatal("WaitRun did not return")
			return nil
		}
	}

	s := newServer(t, nil)
	res, err := s.client().StartRun(t.Context(), s.wf, map[string]int{"total": 1})
	require.NoError(t, err)
	before := s.hits.Load()
	done := wait(s, res.Run.ID)
	apitest.Eventually(t, 30*time.Second, func() bool { return waiters(t, s) == 1 }, "WaitRun's request waits on the server")
	finish(s, res.Run.ID)
	require.Equal(t, client.StatusPassed, result(done).Status)
	require.EqualValues(t, 1, s.hits.Load()-before, "one GET: the server answered it once the run was final")

	ignores := newServer(t, func(c *config.Config) { c.RunMaxWait = 0 })
	res, err = ignores.client().StartRun(t.Context(), ignores.wf, map[string]int{"total": 1})
	require.NoError(t, err)
	before = ignores.hits.Load()
	done = wait(ignores, res.Run.ID)
	apitest.Eventually(t, 30*time.Second, func() bool { return ignores.hits.Load()-before >= 2 }, "WaitRun polls")
	finish(ignores, res.Run.ID)
	require.Equal(t, client.StatusPassed, result(done).Status)
}

// waiters reads the server's valruns_run_waiters gauge: requests it holds
// until their run is final.
func waiters(t *testing.T, s *server) float64 {
	t.Helper()
	families, err := s.env.Registry.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() == "valruns_run_waiters" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no valruns_run_waiters metric")
	return 0
}

// TestWithWaitAgainstTheServer: a start whose key is in flight (its
// advisory lock held by another transaction, as a first request holds it)
// waits on the server with WithWait instead of retrying after 409: one
// attempt, answered once the holder is done. Without it, the client gets
// 409 and retries. The holder lets go only once the server has tried the
// key's lock and found it taken, whenever that is: no timing is assumed.
func TestWithWaitAgainstTheServer(t *testing.T) {
	t.Parallel()
	tries := &lockTries{}
	s := newServerWith(t, apitest.Options{Tracer: tries})
	ctx := t.Context()
	hold := func(key string) {
		tx, err := sql.Open("pgx", s.env.DBURL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Close() })
		conn, err := tx.Conn(ctx)
		require.NoError(t, err)
		_, err = conn.ExecContext(ctx, `BEGIN`)
		require.NoError(t, err)
		_, err = conn.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, idempotency.LockID(s.org.ID, "workflow_start", key))
		require.NoError(t, err)
		tried := tries.of(key)
		go func() {
			select {
			case <-tried: // the server's attempt found the key in flight
			case <-ctx.Done():
			}
			_, _ = conn.ExecContext(context.Background(), `ROLLBACK`)
			_ = conn.Close()
		}()
	}

	hold("waited")
	res, err := s.client().StartRun(ctx, s.wf, map[string]any{"total": 1}, client.WithKey("waited"), client.WithWait(time.Minute))
	require.NoError(t, err)
	require.Equal(t, 1, res.Attempts, "the server waited: no 409, no retry")
	require.False(t, res.Replayed, "the holder rolled back: this request executed")

	hold("retried")
	res, err = s.client(client.WithBackoff(100*time.Millisecond, 300*time.Millisecond), client.WithMaxAttempts(20)).
		StartRun(ctx, s.wf, map[string]any{"total": 1}, client.WithKey("retried"))
	require.NoError(t, err)
	require.Greater(t, res.Attempts, 1, "without WithWait: 409, then a retry")
	require.EqualValues(t, 2, s.env.Count("validation_runs", ""))
}

// lockTries sees the statements the API sends and tells when a key's
// advisory lock has been tried (the statement that takes it has run).
type lockTries struct {
	mu   sync.Mutex
	done map[string]chan struct{}
}

// of is closed once the API has tried key's lock.
func (l *lockTries) of(key string) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.chanOf(key)
}

// chanOf is key's channel; the caller holds l.mu.
func (l *lockTries) chanOf(key string) chan struct{} {
	if l.done == nil {
		l.done = map[string]chan struct{}{}
	}
	if l.done[key] == nil {
		l.done[key] = make(chan struct{})
	}
	return l.done[key]
}

func (l *lockTries) saw(sql string, args []any) {
	if !strings.Contains(sql, "pg_try_advisory_xact_lock") {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	tried := func(key string) {
		ch := l.chanOf(key)
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
	for _, a := range args {
		switch v := a.(type) {
		case string:
			tried(v)
		case []*string: // the start's one statement carries its keys as an array
			for _, key := range v {
				if key != nil {
					tried(*key)
				}
			}
		}
	}
}

func (l *lockTries) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (l *lockTries) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *lockTries) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery runs once the statement's results are read: the lock
// has been tried. (The request transaction sends it in a batch.)
func (l *lockTries) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.saw(d.SQL, d.Args)
}
func (l *lockTries) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestRateLimitedIsRetried: past the organisation's rate (1 start per
// second, burst 1) a start is 429 rate_limited, stored nowhere: the client
// retries it after Retry-After with the same key, and each call starts its
// one run. Past the quota, 429 quota_exceeded is final: one request.
func TestRateLimitedIsRetried(t *testing.T) {
	t.Parallel()
	s := newServerWith(t, apitest.Options{Redis: apitest.Redis(t), Config: func(c *config.Config) {
		c.OrgStartRate = 1
		c.DefaultMonthlyRunQuota = 3
	}})
	c := s.client(client.WithMaxAttempts(20))
	ctx := t.Context()
	before := s.hits.Load()
	keys := map[string]bool{}
	for i := range 3 {
		res, err := c.StartRun(ctx, s.wf, map[string]int{"i": i})
		require.NoError(t, err, "start %d", i)
		require.False(t, keys[res.Key])
		keys[res.Key] = true
		require.EqualValues(t, 1, s.env.Count("validation_runs", "id = ? AND idempotency_key = ?", res.Run.ID, res.Key))
	}
	require.Greater(t, s.hits.Load()-before, int64(3), "three starts in a row at 1 per second: some were limited and retried")
	require.EqualValues(t, 3, s.env.Count("validation_runs", ""), "one run per call")

	// The quota is used up. Once the rate has a start to spare (its bucket
	// refills in a second), quota_exceeded is final: one request.
	time.Sleep(2 * time.Second)
	before = s.hits.Load()
	_, err := c.StartRun(ctx, s.wf, map[string]int{"i": 3}, client.WithKey("over"))
	require.ErrorIs(t, err, client.ErrQuotaExceeded)
	require.EqualValues(t, 1, s.hits.Load()-before, "quota_exceeded is not retried")
	require.EqualValues(t, 3, s.env.Count("validation_runs", ""))
}
