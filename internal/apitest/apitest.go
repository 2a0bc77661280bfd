// Package apitest is the test harness of the HTTP API: a fresh migrated
// database, the real router on it, organisations with tokens, and helpers
// to send requests and decode answers. Tests use real PostgreSQL only.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/internal/apispec/conform"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/internal/testredis"
	"github.com/valruns/valruns/models"
)

// Env is one API under test.
type Env struct {
	T        testing.TB
	DB       *gorm.DB
	DBURL    string
	Config   config.Config
	Registry *prometheus.Registry
	Handler  http.Handler
	// redis is Options.Redis, kept by WithConfig.
	redis            redis.UniversalClient
	rateLimitTimeout time.Duration
	// handOff is where the API hands each committed run (SetHandOff).
	handOff atomic.Pointer[func(*models.QueuedRun)]
}

// SetHandOff makes the API hand each run a start committed to f (as
// serve does to its tasks.Dispatcher), from now on; nil stops it.
func (e *Env) SetHandOff(f func(*models.QueuedRun)) {
	if f == nil {
		e.handOff.Store(nil)
		return
	}
	e.handOff.Store(&f)
}

// Options tunes New.
type Options struct {
	// Config edits the configuration: config.Load's defaults with no
	// environment, except that the harness sets no start rate
	// (ORG_START_RATE=0) and no bound on requests or bodies in flight
	// (MAX_REQUESTS_IN_FLIGHT=0, MAX_BODY_BYTES_IN_FLIGHT=0), so that tests
	// may flood one organisation; a test about those limits sets them here.
	Config func(*config.Config)
	// Redis holds the start rate buckets (handlers.Deps.Redis); nil: no
	// start is rate limited, whatever the rate.
	Redis redis.UniversalClient
	// RateLimitTimeout bounds the rate limit's calls to Redis; 0 means 30 s,
	// so that a slow answer on a loaded machine never fails a test's limit
	// open (a test of failing open sets handlers.RateLimitTimeout).
	RateLimitTimeout time.Duration
	// RateLimitHoldMax is how many refused starts the API holds at once
	// (RATE_LIMIT_HOLD); 0 means the service's 1,024.
	RateLimitHoldMax int
	// Tracer sees every statement of the database pool.
	Tracer pgx.QueryTracer
	// MaxOpenConns of the pool; 0 means models.Open's default.
	MaxOpenConns int
	// HandOff receives each run a start committed (handlers.Deps.HandOff),
	// such as a tasks.Dispatcher's (see also Env.SetHandOff); nil: runs
	// stay queued until a sweeper finds them.
	HandOff func(*models.QueuedRun)
	// Ready is the process's own readiness, checked by /readyz besides
	// the database (handlers.Deps.Ready); nil: always ready.
	Ready func(context.Context) error
	// RunsEnded and RunPollEvery: handlers.Deps' (the long-poll's signal
	// that runs ended, and its tick).
	RunsEnded    <-chan []string
	RunPollEvery time.Duration
	// Tracing gives each request a span (handlers.Deps.Tracing); nil:
	// tracing is off.
	Tracing trace.TracerProvider
}

// New builds the API on a fresh database.
func New(t testing.TB, opts ...Options) *Env {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	cfg, err := config.Load(func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	cfg.OrgStartRate, cfg.MaxRequestsInFlight, cfg.MaxBodyBytesInFlight = 0, 0, 0
	if o.Config != nil {
		o.Config(&cfg)
	}
	db, u := testdb.New(t, testdb.Options{Tracer: o.Tracer, MaxOpenConns: o.MaxOpenConns, StatementTimeout: cfg.IdempotencyTxTimeout})
	cfg.DatabaseURL = u
	reg := prometheus.NewRegistry()
	// Errors the API logs (the causes behind 5xx answers) show in the test's log.
	log := slog.New(slog.NewTextHandler(newTestLog(t), &slog.HandlerOptions{Level: slog.LevelWarn}))
	rlt := o.RateLimitTimeout
	if rlt == 0 {
		rlt = 30 * time.Second
	}
	e := &Env{T: t, DB: db, DBURL: u, Config: cfg, Registry: reg, redis: o.Redis, rateLimitTimeout: rlt}
	e.SetHandOff(o.HandOff)
	e.Handler = handlers.New(handlers.Deps{Config: cfg, DB: db, Registry: reg, Log: log, Redis: o.Redis, RateLimitTimeout: rlt,
		RateLimitHoldMax: o.RateLimitHoldMax, Ready: o.Ready,
		RunsEnded: o.RunsEnded, RunPollEvery: o.RunPollEvery, Tracing: o.Tracing, HandOff: func(q *models.QueuedRun) {
			if f := e.handOff.Load(); f != nil {
				(*f)(q)
			}
		}})
	return e
}

// WithConfig returns the API on the same database with its configuration
// edited, such as a short IDEMPOTENCY_TX_TIMEOUT for the one request meant
// to outlive it, while every other request of the test keeps the default
// budget and so passes however slow the machine is. It has its own metrics.
func (e *Env) WithConfig(edit func(*config.Config)) *Env {
	cfg := e.Config
	edit(&cfg)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(newTestLog(e.T), &slog.HandlerOptions{Level: slog.LevelWarn}))
	return &Env{T: e.T, DB: e.DB, DBURL: e.DBURL, Config: cfg, Registry: reg, redis: e.redis, rateLimitTimeout: e.rateLimitTimeout,
		Handler: handlers.New(handlers.Deps{Config: cfg, DB: e.DB, Registry: reg, Log: log, Redis: e.redis, RateLimitTimeout: e.rateLimitTimeout})}
}

// testLog writes log lines to the test's log while the test runs. Lines
// after its end are dropped: the server's background goroutines may still
// log once the test is over,
// and testing forbids t.Log then (its end is set without a lock, a race).
type testLog struct {
	t     testing.TB
	mu    sync.Mutex
	ended bool
}

func newTestLog(t testing.TB) *testLog {
	w := &testLog{t: t}
	t.Cleanup(func() { // cleanups run before testing marks the test done
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
	})
	return w
}

func (w *testLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

// Org is an organisation with one API token.
type Org struct {
	ID, Slug, Token string
}

// NewOrg creates an organisation named name and a token for it.
func (e *Env) NewOrg(name string) Org {
	e.T.Helper()
	ctx := context.Background()
	org, err := models.NewOrgStore(e.DB).Create(ctx, name)
	if err != nil {
		e.T.Fatal(err)
	}
	tok, _, err := models.NewTokenStore(e.DB).Create(ctx, org.ID)
	if err != nil {
		e.T.Fatal(err)
	}
	return Org{ID: org.ID, Slug: org.Slug, Token: tok}
}

// Response is a recorded answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into v, failing the test when it cannot.
func (r Response) JSON(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %d body %q: %v", r.Status, r.Body, err)
	}
}

// Map decodes the body as a JSON object.
func (r Response) Map(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	r.JSON(t, &m)
	return m
}

// Do sends a request through the router. body is sent as is when it is a
// string, []byte or io.Reader, JSON-encoded otherwise (nil: no body). headers are
// name/value pairs; token "" sends no Authorization.
func (e *Env) Do(method, path, token string, body any, headers ...string) Response {
	e.T.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	case io.Reader:
		rd = b
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.T.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req := httptest.NewRequest(method, path, rd)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	e.Handler.ServeHTTP(rec, req)
	r := Response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
	e.conform(req, r)
	return r
}

// conform fails the test when r, the answer to req, is not one the API's
// OpenAPI document allows for req's operation (package conform): so every
// answer of every test through Do is also a test of the spec. Answers to
// requests the document has no operation for (unknown routes, HEAD) are
// not checked.
func (e *Env) conform(req *http.Request, r Response) {
	e.T.Helper()
	c, err := conform.Spec()
	if err == nil {
		err = c.Check(req, r.Status, r.Header, r.Body)
	}
	if err != nil && !errors.Is(err, conform.ErrNotDocumented) {
		e.T.Errorf("the API and its spec disagree (fix the server or the annotations, then make docs): %v", err)
	}
}

// Server serves the API on a real loopback listener (for clients that hang
// up, browsers and load), closed at the end of the test.
func (e *Env) Server() *httptest.Server {
	srv := httptest.NewServer(e.Handler)
	e.T.Cleanup(srv.Close)
	return srv
}

// NewWorkflow creates a workflow through the API and returns its id.
func (e *Env) NewWorkflow(org Org, body any) string {
	e.T.Helper()
	r := e.Do(http.MethodPost, "/api/workflows/", org.Token, body)
	if r.Status != http.StatusCreated {
		e.T.Fatalf("create workflow: %d %s", r.Status, r.Body)
	}
	return r.Map(e.T)["id"].(string)
}

// Count returns SELECT count(*) FROM table WHERE where (args bound).
func (e *Env) Count(table, where string, args ...any) int64 {
	e.T.Helper()
	var n int64
	q := "SELECT count(*) FROM " + table
	if where != "" {
		q += " WHERE " + where
	}
	if err := e.DB.Raw(q, args...).Scan(&n).Error; err != nil {
		e.T.Fatal(err)
	}
	return n
}

// Eventually polls cond every 20 ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s: %s", timeout, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Redis is a client of TEST_REDIS_URL (internal/testredis) for Options.Redis, closed at the end of the test. The start rate buckets
// are keyed by organisation, and every test has organisations of its own,
// so tests share the database without flushing it (other packages' tests
// use it at the same time).
func Redis(t testing.TB) redis.UniversalClient {
	t.Helper()
	u := testredis.URL(t)
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("TEST_REDIS_URL: %v", err)
	}
	rc := redis.NewClient(opt)
	t.Cleanup(func() { _ = rc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rc.Ping(ctx).Err(); err != nil {
		t.Fatalf("TEST_REDIS_URL %s: %v", u, err)
	}
	return rc
}
