// Package handlers is the HTTP layer of valruns: the Gin router, its
// middleware (request id, logging, metrics, body limit, auth) and the
// handlers with their swag annotations. Handlers translate models errors to
// problem documents; they never read a PostgreSQL error themselves.
package handlers

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// Scopes of the idempotent endpoints: keys are unique per organisation and scope.
const (
	ScopeWorkflowCreate = "workflow_create"
	ScopeWorkflowStart  = "workflow_start"
	ScopeWebhookCreate  = "webhook_endpoint_create"
	ScopeWebhookRotate  = "webhook_secret_rotate"
	ScopeWebhookResend  = "webhook_delivery_redeliver"
	ScopeWebhookTest    = "webhook_test_event"
)

// Deps is everything the router needs, built by main.
type Deps struct {
	Config   config.Config
	DB       *gorm.DB
	Log      *slog.Logger
	Registry *prometheus.Registry
	// Redis, when set, holds the organisations' start rate buckets
	// (ORG_START_RATE, shared by every API process); nil: no start is rate
	// limited. Its calls are bounded by RateLimitTimeout, whatever the
	// client's own timeouts. The limit adds a hook that watches the
	// client's dials: a Redis it cannot reach is down, not slow.
	Redis redis.UniversalClient
	// RateLimitTimeout bounds each call of the rate limit to Redis; 0 means
	// RateLimitTimeout (tests on a loaded machine give a generous one).
	RateLimitTimeout time.Duration
	// RateLimitHoldMax is how many refused starts the process holds at once
	// (RATE_LIMIT_HOLD); 0 means 1,024.
	RateLimitHoldMax int
	// Ready, when set, is checked by /readyz besides the database.
	Ready func(context.Context) error
	// HandOff, when set, gives each run a start committed to the queue
	// (tasks.Dispatcher); without it, the worker's sweeper finds the run
	// after RUN_REDELIVER_AFTER.
	HandOff func(*models.QueuedRun)
	// Stop, when set, is closed as the process begins to stop: every
	// long-poll waiting (GET /api/runs/{id}/ with Prefer: wait) answers its
	// run as it is at once, rather than holding up a graceful shutdown for
	// up to RUN_MAX_WAIT, and the long-poll's poller ends. Nil: never.
	Stop <-chan struct{}
	// RunsEnded, when set, tells which runs ended, after their final commit
	// (the workers, through Redis: tasks.WatchRunsEnded): the long-poll
	// answers their waiters at once. A nil message says only that runs
	// ended: it asks at once which of its runs are final. Nil: the tick
	// alone (RunPollEvery).
	RunsEnded <-chan []string
	// RunPollEvery is the long-poll's tick while requests wait; 0 means
	// 100 ms.
	RunPollEvery time.Duration
	// Tracing, when set, gives each request a span named by its route
	// (honouring the client's traceparent); nil: tracing is off, and no
	// request pays for it.
	Tracing trace.TracerProvider
}

// New builds the HTTP handler of the API: the router behind a trailing-slash
// normaliser, so /api/workflows and /api/workflows/ are one route, with no
// redirect.
func New(d Deps) http.Handler { return StripTrailingSlash(NewRouter(d)) }

// NewRouter builds the Gin engine with every route registered (without
// trailing slashes; serve it through New).
func NewRouter(d Deps) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Registry == nil {
		d.Registry = prometheus.NewRegistry()
	}
	m := newMetrics(d.Registry)

	r := gin.New()
	r.RedirectTrailingSlash = false
	r.RedirectFixedPath = false
	r.HandleMethodNotAllowed = true
	// Route on the path as sent, and unescape the parameters: an
	// idempotency key in a path may hold a percent-encoded "/".
	r.UseRawPath = true
	r.UnescapePathValues = true
	r.ContextWithFallback = true
	_ = r.SetTrustedProxies(nil) // ClientIP is the peer address; no spoofable X-Forwarded-For
	if d.Tracing != nil {
		r.Use(traceRequests(d.Tracing))
	}
	r.Use(requestID(), recovery(d.Log), logRequests(d.Log), m.middleware(), limitBody(d.Config.MaxBodyBytes))
	r.NoRoute(func(c *gin.Context) {
		problem.Abort(c, http.StatusNotFound, problem.NotFound, "No route matches "+c.Request.Method+" "+c.Request.URL.Path+".")
	})
	r.NoMethod(func(c *gin.Context) {
		problem.Abort(c, http.StatusMethodNotAllowed, problem.MethodNotAllowed, "Method "+c.Request.Method+" is not allowed on "+c.Request.URL.Path+".")
	})

	orgs := models.NewTokenStore(d.DB)
	wf := &workflowHandlers{workflows: models.NewWorkflowStore(d.DB)}
	runStore := models.NewRunStore(d.DB)
	runStore.SetStartTimeout(d.Config.IdempotencyTxTimeout)
	runStore.SetStartObserver(m.observeStarts)
	// The long-poll's one poller asks for every waited run at once, under
	// the bound of a read's first answer (a hung database fails the tick,
	// not the poller).
	finished := func(ctx context.Context, ids []string) ([]string, error) {
		ctx, cancel := models.FirstAnswer(ctx, d.DB)
		defer cancel()
		return runStore.Finished(ctx, ids)
	}
	runs := &runHandlers{runs: runStore, defaultQuota: d.Config.DefaultMonthlyRunQuota, handOff: d.HandOff,
		maxWait: d.Config.RunMaxWait, waits: newRunWaits(finished, d.Config.RunMaxWaiters, d.Stop, d.Log, d.Registry)}
	runs.waits.ended = d.RunsEnded
	if d.RunPollEvery > 0 {
		runs.waits.every = d.RunPollEvery
	}
	usage := &usageHandlers{usage: models.NewUsageStore(d.DB), defaultQuota: d.Config.DefaultMonthlyRunQuota}
	keys := &keyHandlers{keys: models.NewKeyStore(d.DB)}
	hooks := &webhookHandlers{endpoints: models.NewWebhookStore(d.DB), allowPrivate: d.Config.WebhookAllowPrivateTargets}
	idem := idempotency.New(models.NewKeyStore(d.DB), idempotency.Config{
		TTL:          d.Config.IdempotencyTTL,
		TxTimeout:    d.Config.IdempotencyTxTimeout,
		KeyRequired:  d.Config.IdempotencyKeyRequired,
		MaxBodyBytes: d.Config.MaxBodyBytes,
		MaxWait:      d.Config.IdempotencyMaxWait,
		MaxWaiters:   d.Config.IdempotencyMaxWaiters,
		Tenant:       func(c *gin.Context) string { return principalOf(c).OrgID },
		Log:          d.Log,
		Observe:      m.observeIdempotency,
	})

	d.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "valruns_idempotency_waiting",
		Help: "Requests of this process waiting (Prefer: wait) for the in-flight request with their Idempotency-Key.",
	}, func() float64 { return float64(idem.Waiting()) }))

	health := &healthHandlers{db: d.DB, ready: d.Ready}
	get(r, "/healthz", health.live)
	get(r, "/readyz", health.readyz)
	get(r, "/metrics", gin.WrapH(promhttpHandler(d.Registry)))
	get(r, "/", index)
	get(r, "/swagger/*any", swaggerUI())
	get(r, "/problems", problemIndex)
	get(r, "/problems/:code", problemPage)

	// Requests and bodies in flight are bounded before anything else is
	// done for them; /healthz, /metrics and the docs stay outside the bounds.
	admit := newAdmission(d.Config.MaxRequestsInFlight, d.Config.MaxBodyBytesInFlight, d.Config.MaxBodyBytes,
		d.Config.OverloadWait, d.Registry)
	startRate := newRateLimiter(d.Redis, d.Config.OrgStartRate, d.RateLimitTimeout, d.Config.RateLimitHold, d.RateLimitHoldMax,
		d.Log, d.Registry)

	api := r.Group("/api", admit.middleware(), firstAnswer(d.DB), authenticate(orgs, d.Config.AuthCacheTTL))
	api.POST("/workflows", idem.Wrap(ScopeWorkflowCreate, orgChecked(wf.create)))
	get(api, "/workflows", wf.list)
	get(api, "/workflows/:id", wf.get)
	// The rate limit runs before the idempotency wrapper: its 429 is not
	// stored against the key (unlike quota_exceeded), so a retry executes.
	api.POST("/workflows/:id/start", startRate.middleware(), idem.WrapPrepared(ScopeWorkflowStart, orgCheckedPrepared(runs.prepare)))
	get(api, "/runs", runs.list)
	get(api, "/runs/:id", runs.get)
	get(api, "/usage", usage.get)
	get(api, "/idempotency-keys/:scope/:key", keys.get)
	api.POST("/webhook-endpoints", idem.Wrap(ScopeWebhookCreate, orgChecked(hooks.create)))
	get(api, "/webhook-endpoints", hooks.list)
	get(api, "/webhook-endpoints/:id", hooks.get)
	api.DELETE("/webhook-endpoints/:id", hooks.delete)
	api.POST("/webhook-endpoints/:id/rotate-secret", idem.WrapNoBody(ScopeWebhookRotate, orgChecked(hooks.rotate)))
	get(api, "/webhook-endpoints/:id/deliveries", hooks.deliveries)
	api.POST("/webhook-endpoints/:id/deliveries/:delivery_id/redeliver", idem.WrapNoBody(ScopeWebhookResend, orgChecked(hooks.redeliver)))
	api.POST("/webhook-endpoints/:id/test", idem.WrapNoBody(ScopeWebhookTest, orgChecked(hooks.sendTest)))
	return r
}

// get registers a GET route and the same route for HEAD: the answer's
// status and headers without its body (net/http drops the body of a HEAD).
func get(r gin.IRoutes, path string, h gin.HandlerFunc) {
	r.GET(path, h)
	r.HEAD(path, h)
}

// firstAnswer bounds the database work of an /api/ read (GET, HEAD) by
// DATABASE_ACQUIRE_TIMEOUT plus DATABASE_ANSWER_TIMEOUT: a hung database is
// a 503 service_unavailable in seconds, not a request that hangs. (A start
// bounds its first answer in models.BeginRequest, and the token check in
// models.TokenStore.Authenticate.)
func firstAnswer(db *gorm.DB) gin.HandlerFunc {
	return func(c *gin.Context) {
		if db == nil || (c.Request.Method != http.MethodGet && c.Request.Method != http.MethodHead) {
			c.Next()
			return
		}
		b := &answerBound{parent: c.Request.Context(), db: db}
		ctx, cancel := models.FirstAnswer(b.parent, db)
		b.cancel = cancel
		defer func() { b.cancel() }() // the bound rebound made last, if any
		c.Set(firstAnswerKey, b)
		c.Request = c.Request.WithContext(ctx)
		c.Next()
	}
}

// firstAnswerKey holds a read's *answerBound in its gin context.
const firstAnswerKey = "valruns.firstanswer"

// answerBound is what firstAnswer bounded: the request's own context
// before the bound, for a read that waits longer than the bound allows
// (a long-poll) and then reads again (rebound).
type answerBound struct {
	parent context.Context
	db     *gorm.DB
	cancel context.CancelFunc
}

// unbounded is the request's context without firstAnswer's bound (still
// ending when the client hangs up), for a wait that holds no connection.
func unbounded(c *gin.Context) context.Context {
	if b, ok := c.Value(firstAnswerKey).(*answerBound); ok {
		return b.parent
	}
	return c.Request.Context()
}

// rebound gives the request a fresh first-answer bound, counted from now,
// for its statements after a long wait; the organisation's turns
// (models.WithTenant) go with it. The bound ends with the request.
func rebound(c *gin.Context) {
	b, ok := c.Value(firstAnswerKey).(*answerBound)
	if !ok {
		return
	}
	b.cancel() // the old bound, expired or not
	ctx := models.WithTenant(b.parent, principalOf(c).OrgID)
	ctx, b.cancel = models.FirstAnswer(ctx, b.db)
	c.Request = c.Request.WithContext(ctx)
}

// StripTrailingSlash serves /a/b/ as /a/b, so every route answers with and
// without its trailing slash, with no redirect, and an idempotent request's
// fingerprint does not depend on it.
func StripTrailingSlash(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; len(p) > 1 && strings.HasSuffix(p, "/") && !strings.HasPrefix(p, "/swagger/") {
			r.URL.Path = strings.TrimRight(p, "/")
			if r.URL.Path == "" {
				r.URL.Path = "/"
			}
			if r.URL.RawPath != "" {
				r.URL.RawPath = strings.TrimRight(r.URL.RawPath, "/")
			}
		}
		next.ServeHTTP(w, r)
	})
}
