package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/canonjson"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// The wrapper is generic: these tests wrap a tiny handler that writes into a
// table of its own (items), on a real PostgreSQL database, with nothing else
// of the service in sight.

const (
	scopeItems = "item_create"
	scopeOther = "item_other"
)

// handler modes: what the wrapped handler does after writing its item.
const (
	modeOK       = "ok"        // 201
	modeError    = "error"     // returns an error
	modePanic    = "panic"     // panics
	mode503      = "503"       // answers 503
	modeConflict = "conflict"  // answers 409 after writing
	modeSleep    = "sleep"     // outlives TxTimeout in the database
	modeHeaders  = "headers"   // answers 201 with headers that must never be stored
	modeCheckCtx = "check_ctx" // 201, and records whether its context was cancelled
	modeHuge     = "huge"      // 201 with a body of 5 MiB
	modeRefuse   = "refuse"    // refuses with a 401 after writing (Refuse)
	modeGate     = "gate"      // 201, once gate is closed (after writing)
)

// wrapEnv is one wrapped engine on a fresh database.
type wrapEnv struct {
	t      *testing.T
	db     *gorm.DB
	org    string
	engine *gin.Engine
	// w wraps the routes (but see X-Short-Tx and X-No-Answer-Cache).
	w *idempotency.Wrapper[*models.RequestTx]
	// mode is what the handler does next (modeOK by default).
	mode atomic.Value
	// calls counts handler executions.
	calls atomic.Int64
	// ctxErr is the handler's ctx.Err() in modeCheckCtx.
	ctxErr atomic.Value
	// gate holds the handler in modeGate until it is closed.
	gate chan struct{}

	mu       sync.Mutex
	outcomes []string
}

// newWrapEnv builds the env; each of opts is applied to its wrappers
// before they serve a request.
func newWrapEnv(t *testing.T, cfg idempotency.Config, opts ...func(*idempotency.Wrapper[*models.RequestTx])) *wrapEnv {
	t.Helper()
	db, _ := testdb.New(t)
	require.NoError(t, db.Exec(`CREATE TABLE items (
		id bigserial PRIMARY KEY,
		org_id uuid NOT NULL REFERENCES organizations (id),
		name text NOT NULL)`).Error)
	org, err := models.NewOrgStore(db).Create(context.Background(), "wrap "+t.Name())
	require.NoError(t, err)
	e := &wrapEnv{t: t, db: db, org: org.ID, gate: make(chan struct{})}
	e.mode.Store(modeOK)

	if cfg.Tenant == nil {
		// X-Tenant picks another organisation; absent, the env's own.
		cfg.Tenant = func(c *gin.Context) string {
			if v := c.GetHeader("X-Tenant"); v != "" {
				return v
			}
			return e.org
		}
	}
	cfg.Observe = func(scope, outcome string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.outcomes = append(e.outcomes, scope+":"+outcome)
	}
	w := idempotency.New(models.NewKeyStore(db), cfg)
	// X-Short-Tx: 1 sends a request through a wrapper whose transaction
	// deadline is 300 ms, for the one request of a test meant to outlive
	// it (it sleeps 10 s in the database, past any deadline); every other
	// request keeps cfg's budget, so a slow machine cannot time it out.
	shortCfg := cfg
	shortCfg.TxTimeout = 300 * time.Millisecond
	short := idempotency.New(models.NewKeyStore(db), shortCfg)
	// X-No-Answer-Cache: 1 sends a request through a wrapper without the
	// cache of answers: its replays are read from the database.
	noCache := idempotency.New(models.NewKeyStore(db), cfg)
	idempotency.WithoutAnswerCache(noCache)
	for _, opt := range opts {
		opt(w)
		opt(short)
	}
	e.w = w

	gin.SetMode(gin.TestMode)
	r := gin.New() // no gin.Recovery: a panic escaping the wrapper would crash the test
	r.Use(func(c *gin.Context) {
		c.Set(problem.RequestIDKey, c.GetHeader(idempotency.HeaderRequestID))
		c.Next()
	})
	h := func(rtx *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
		tx := rtx.DB()
		e.calls.Add(1)
		var in struct {
			Name string `json:"name"`
		}
		if len(req.Body) > 0 {
			if err := json.Unmarshal(req.Body, &in); err != nil {
				return idempotency.Problem(req, problem.New(http.StatusBadRequest, problem.ValidationError, err.Error())), nil
			}
		}
		if err := tx.Exec(`INSERT INTO items (org_id, name) VALUES (?, ?)`, cfg.Tenant(req.Gin), in.Name).Error; err != nil {
			return idempotency.Response{}, err
		}
		switch e.mode.Load().(string) {
		case modeError:
			return idempotency.Response{}, errors.New("boom")
		case modePanic:
			panic("handler exploded")
		case mode503:
			return idempotency.Response{Status: http.StatusServiceUnavailable, Body: []byte(`{"down":true}`),
				Header: http.Header{"Content-Type": {"application/json"}, "X-Down": {"yes"}}}, nil
		case modeConflict:
			return idempotency.Problem(req, problem.Details{Type: "/problems/item_conflict", Title: "Conflict",
				Status: http.StatusConflict, Detail: "conflict after writing", Code: "item_conflict"}), nil
		case modeSleep:
			if err := tx.Exec(`SELECT pg_sleep(10)`).Error; err != nil {
				return idempotency.Response{}, err
			}
		case modeCheckCtx:
			e.ctxErr.Store(errString(tx.Statement.Context.Err()))
		case modeGate:
			<-e.gate
		case modeHuge:
			return idempotency.JSON(http.StatusCreated, map[string]any{"blob": strings.Repeat("x", 5<<20)})
		case modeRefuse:
			resp := idempotency.Refuse(req, problem.New(http.StatusUnauthorized, problem.InvalidToken, "gone"))
			resp.Header.Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			return resp, nil
		}
		resp, err := idempotency.JSON(http.StatusCreated, map[string]any{"name": in.Name, "call": e.calls.Load()})
		if err != nil {
			return resp, err
		}
		resp.Header.Set("Location", "/items/"+in.Name)
		if e.mode.Load().(string) == modeHeaders {
			resp.Header.Set("Set-Cookie", "session=secret")
			resp.Header.Set("WWW-Authenticate", `Bearer realm="x"`)
			resp.Header.Set("Authorization", "Bearer leaked")
			resp.Header.Set("X-Internal", "nope")
		}
		return resp, nil
	}
	normal, shortItems, noCacheItems := w.Wrap(scopeItems, h), short.Wrap(scopeItems, h), noCache.Wrap(scopeItems, h)
	items := func(c *gin.Context) {
		switch {
		case c.GetHeader("X-Short-Tx") == "1":
			shortItems(c)
		case c.GetHeader("X-No-Answer-Cache") == "1":
			noCacheItems(c)
		default:
			normal(c)
		}
	}
	// One scope on two methods and two routes: the same key on another
	// method or path is another request.
	for _, path := range []string{"/items", "/groups/:id/items"} {
		r.POST(path, items)
		r.PUT(path, items)
	}
	r.POST("/other", w.Wrap(scopeOther, h))
	e.engine = r
	return e
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

type wrapResp struct {
	Status int
	Header http.Header
	Body   []byte
}

// do sends POST path with body and the given header pairs.
func (e *wrapEnv) do(path, body string, headers ...string) wrapResp {
	return e.doCtx(context.Background(), path, body, headers...)
}

func (e *wrapEnv) doCtx(ctx context.Context, path, body string, headers ...string) wrapResp {
	return e.send(ctx, http.MethodPost, path, body, headers...)
}

// send sends method path with body and the given header pairs.
func (e *wrapEnv) send(ctx context.Context, method, path, body string, headers ...string) wrapResp {
	req := httptest.NewRequestWithContext(ctx, method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	e.engine.ServeHTTP(rec, req)
	return wrapResp{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
}

func (e *wrapEnv) count(table, where string, args ...any) int64 {
	e.t.Helper()
	var n int64
	require.NoError(e.t, e.db.Raw("SELECT count(*) FROM "+table+" WHERE "+where, args...).Scan(&n).Error)
	return n
}

func (e *wrapEnv) items(name string) int64 { return e.count("items", "name = ?", name) }

func (e *wrapEnv) keyRows(key string) int64 { return e.count("idempotency_keys", "key = ?", key) }

// lastOutcome is the outcome Observe was last told.
func (e *wrapEnv) lastOutcome() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.outcomes) == 0 {
		return ""
	}
	return e.outcomes[len(e.outcomes)-1]
}

func code(t *testing.T, r wrapResp) string {
	t.Helper()
	var d problem.Details
	require.NoError(t, json.Unmarshal(r.Body, &d), "body %s", r.Body)
	return d.Code
}

// TestWrapFailureRollsBack: an error, a panic or a 5xx answer undoes the
// handler's writes and stores nothing, so the key is free and a retry
// executes afresh.
func TestWrapFailureRollsBack(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{})
	tests := []struct {
		name       string
		mode       string
		withKey    bool
		wantStatus int
		wantCode   string // problem code; "" for a passed-through body
		wantBody   string
	}{
		{name: "handler error is 500, rolled back", mode: modeError, withKey: true, wantStatus: 500, wantCode: idempotency.CodeInternal},
		{name: "handler panic is a 500 problem, no crash, rolled back", mode: modePanic, withKey: true, wantStatus: 500, wantCode: idempotency.CodeInternal},
		{name: "handler 503 is passed through, not stored, rolled back", mode: mode503, withKey: true, wantStatus: 503, wantBody: `{"down":true}`},
		{name: "without a key an error still rolls back", mode: modeError, wantStatus: 500, wantCode: idempotency.CodeInternal},
		{name: "without a key a panic still rolls back", mode: modePanic, wantStatus: 500, wantCode: idempotency.CodeInternal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.NewReplacer(" ", "-", ",", "").Replace(tc.name)
			key := "key-" + name
			body := `{"name":"` + name + `"}`
			var hdr []string
			if tc.withKey {
				hdr = []string{idempotency.HeaderKey, key}
			}

			e.mode.Store(tc.mode)
			r := e.do("/items", body, hdr...)
			require.Equal(t, tc.wantStatus, r.Status, "body %s", r.Body)
			if tc.wantCode != "" {
				require.Equal(t, problem.ContentType, r.Header.Get("Content-Type"))
				require.Equal(t, tc.wantCode, code(t, r))
				require.NotContains(t, string(r.Body), "boom", "the error is not leaked")
				require.NotContains(t, string(r.Body), "exploded", "the panic is not leaked")
			} else {
				require.Equal(t, tc.wantBody, string(r.Body))
				require.Equal(t, "yes", r.Header.Get("X-Down"))
			}
			require.Empty(t, r.Header.Get(idempotency.HeaderReplayed))
			require.Equal(t, scopeItems+":"+idempotency.OutcomeError, e.lastOutcome())
			require.Zero(t, e.items(name), "the handler's write was rolled back")
			require.Zero(t, e.keyRows(key), "nothing stored")

			if !tc.withKey {
				return
			}
			// The key is free: the retry executes and is stored.
			e.mode.Store(modeOK)
			r = e.do("/items", body, hdr...)
			require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
			require.Empty(t, r.Header.Get(idempotency.HeaderReplayed))
			require.Equal(t, scopeItems+":"+idempotency.OutcomeNew, e.lastOutcome())
			require.EqualValues(t, 1, e.items(name))
			require.EqualValues(t, 1, e.keyRows(key))
			// And the one after replays without executing.
			calls := e.calls.Load()
			r2 := e.do("/items", body, hdr...)
			require.Equal(t, http.StatusCreated, r2.Status)
			require.Equal(t, "true", r2.Header.Get(idempotency.HeaderReplayed))
			require.Equal(t, r.Body, r2.Body)
			require.Equal(t, calls, e.calls.Load())
			require.EqualValues(t, 1, e.items(name))
		})
	}
}

// TestWrapRefusalRollsBack: a handler's refusal (Refuse) is answered as
// it is, headers included, like a check before the handler: its writes are
// rolled back and nothing is stored, so the retry executes.
func TestWrapRefusalRollsBack(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{})
	for _, hdr := range [][]string{{idempotency.HeaderKey, "k-refused"}, nil} {
		e.mode.Store(modeRefuse)
		r := e.do("/items", `{"name":"refused"}`, hdr...)
		require.Equal(t, http.StatusUnauthorized, r.Status, "body %s", r.Body)
		require.Equal(t, problem.InvalidToken.String(), code(t, r))
		require.Equal(t, `Bearer error="invalid_token"`, r.Header.Get("WWW-Authenticate"))
		require.Empty(t, r.Header.Get(idempotency.HeaderKeyExpires), "not stored under the key")
		require.Equal(t, scopeItems+":"+idempotency.OutcomeRejected, e.lastOutcome())
		require.Zero(t, e.items("refused"), "the handler's write was rolled back")
	}
	require.Zero(t, e.keyRows("k-refused"), "nothing stored")

	e.mode.Store(modeOK)
	r := e.do("/items", `{"name":"refused"}`, idempotency.HeaderKey, "k-refused")
	require.Equal(t, http.StatusCreated, r.Status, "the key is free: the retry executes: %s", r.Body)
	require.Empty(t, r.Header.Get(idempotency.HeaderReplayed))
	require.EqualValues(t, 1, e.items("refused"))
}

// TestWrap4xxAfterWritingCommits documents the wrapper's contract: a 4xx is
// an answer like a 2xx, so whatever the handler wrote before answering it
// commits with it and the answer is replayed. Handlers answer 4xx before
// writing.
func TestWrap4xxAfterWritingCommits(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{})
	e.mode.Store(modeConflict)
	r := e.do("/items", `{"name":"c"}`, idempotency.HeaderKey, "k4xx")
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, "item_conflict", code(t, r))
	require.EqualValues(t, 1, e.items("c"), "the write before the 4xx committed")
	require.EqualValues(t, 1, e.keyRows("k4xx"), "the 4xx is stored")

	calls := e.calls.Load()
	r2 := e.do("/items", `{"name":"c"}`, idempotency.HeaderKey, "k4xx")
	require.Equal(t, http.StatusConflict, r2.Status)
	require.Equal(t, "true", r2.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, r.Body, r2.Body)
	require.Equal(t, calls, e.calls.Load(), "replayed, not executed")
	require.EqualValues(t, 1, e.items("c"))
}

// TestWrapOutcomes: Observe is told the scope and the outcome of each request.
func TestWrapOutcomes(t *testing.T) {
	t.Parallel()
	// Without the cache of answers: "expired reused" expires k1 by SQL and
	// retries at once, which the cache, trusting the expires_at it saw,
	// would still replay (no time passed for it). The cache's outcomes are
	// TestAnswerCacheReplayIsTheDatabaseReplay's.
	e := newWrapEnv(t, idempotency.Config{}, idempotency.WithoutAnswerCache)
	var tx *gorm.DB // the advisory lock holder of the in_progress step
	t.Cleanup(func() {
		if tx != nil {
			tx.Rollback()
		}
	})
	steps := []struct {
		name    string
		before  func(t *testing.T)
		path    string
		body    string
		headers []string
		status  int
		outcome string
	}{
		{name: "no key", path: "/items", body: `{"name":"a"}`, status: 201, outcome: idempotency.OutcomeNoKey},
		{name: "bad key rejected", path: "/items", body: `{"name":"a"}`, headers: []string{idempotency.HeaderKey, "\x01"}, status: 400, outcome: idempotency.OutcomeRejected},
		{name: "too long key rejected", path: "/items", body: `{"name":"a"}`, headers: []string{idempotency.HeaderKey, strings.Repeat("k", 256)}, status: 400, outcome: idempotency.OutcomeRejected},
		{name: "malformed JSON rejected", path: "/items", body: `{"name":`, headers: []string{idempotency.HeaderKey, "k1"}, status: 400, outcome: idempotency.OutcomeRejected},
		{name: "two key headers rejected", path: "/items", body: `{"name":"a"}`, headers: []string{idempotency.HeaderKey, "k1", idempotency.HeaderKey, "k2"}, status: 400, outcome: idempotency.OutcomeRejected},
		{name: "new", path: "/items", body: `{"name":"a"}`, headers: []string{idempotency.HeaderKey, "k1"}, status: 201, outcome: idempotency.OutcomeNew},
		{name: "replayed", path: "/items", body: `{ "name" : "a" }`, headers: []string{idempotency.HeaderKey, "k1"}, status: 201, outcome: idempotency.OutcomeReplayed},
		{name: "mismatch", path: "/items", body: `{"name":"b"}`, headers: []string{idempotency.HeaderKey, "k1"}, status: 422, outcome: idempotency.OutcomeMismatch},
		{
			name: "in progress",
			before: func(t *testing.T) {
				tx = e.db.Begin()
				require.NoError(t, tx.Error)
				require.NoError(t, tx.Exec(`SELECT pg_advisory_xact_lock(?)`, idempotency.LockID(e.org, scopeItems, "k2")).Error)
			},
			path: "/items", body: `{"name":"a"}`, headers: []string{idempotency.HeaderKey, "k2"}, status: 409, outcome: idempotency.OutcomeInProgress,
		},
		{
			name: "expired reused",
			before: func(t *testing.T) {
				require.NoError(t, e.db.Exec(`UPDATE idempotency_keys SET created_at = now() - interval '2 days',
					expires_at = now() - interval '1 day' WHERE key = 'k1'`).Error)
			},
			path: "/items", body: `{"name":"b"}`, headers: []string{idempotency.HeaderKey, "k1"}, status: 201, outcome: idempotency.OutcomeExpiredReused,
		},
		{
			name:   "error",
			before: func(*testing.T) { e.mode.Store(modeError) },
			path:   "/other", body: `{"name":"z"}`, headers: []string{idempotency.HeaderKey, "k3"}, status: 500, outcome: idempotency.OutcomeError,
		},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if s.before != nil {
				s.before(t)
			}
			r := e.do(s.path, s.body, s.headers...)
			require.Equal(t, s.status, r.Status, "body %s", r.Body)
			scope := scopeItems
			if s.path == "/other" {
				scope = scopeOther
			}
			require.Equal(t, scope+":"+s.outcome, e.lastOutcome())
		})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	require.Len(t, e.outcomes, len(steps), "Observe is called once per request")
}

// TestWrapReusedKeyNamesWhatDiffered: a key reused for another request of
// its scope is a 422 whose detail names each part of the fingerprint that
// differs, the method, the path and the body, whether the first answer is
// replayed from the cache or read from the database; the path's ids compare
// in canonical form, as the fingerprint's do.
func TestWrapReusedKeyNamesWhatDiffered(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{})
	a, b := "0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a", "5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a"
	upper := strings.ToUpper(a)
	for _, mode := range []struct{ name, header string }{{"cache", "0"}, {"database", "1"}} {
		t.Run(mode.name, func(t *testing.T) {
			do := func(method, path, body, key string) wrapResp {
				return e.send(context.Background(), method, path, body, idempotency.HeaderKey, key, "X-No-Answer-Cache", mode.header)
			}
			first := func(method, path, body, key string) {
				t.Helper()
				r := do(method, path, body, key)
				require.Equal(t, http.StatusCreated, r.Status, "%s %s: %s", method, path, r.Body)
			}
			k1, k2 := mode.name+"-1", mode.name+"-2"
			first(http.MethodPost, "/groups/"+a+"/items", `{"name":"a"}`, k1)
			// The id as sent is stored: it compares in canonical form.
			first(http.MethodPost, "/groups/{"+upper+"}/items", `{"name":"a"}`, k2)
			for _, tt := range []struct {
				method, path, body, key, differs string
			}{
				{http.MethodPost, "/groups/" + a + "/items", `{"name":"b"}`, k1, "body"},
				{http.MethodPost, "/groups/urn:uuid:" + a + "/items", `{"name":"b"}`, k1, "body"},
				{http.MethodPost, "/groups/" + b + "/items", `{"name":"a"}`, k1, "path"},
				{http.MethodPost, "/groups/" + b + "/items", `{"name":"b"}`, k1, "path and body"},
				{http.MethodPost, "/items", `{"name":"a"}`, k1, "path"},
				{http.MethodPut, "/groups/" + a + "/items", `{"name":"a"}`, k1, "method"},
				{http.MethodPut, "/groups/" + upper + "/items", `{"name":"b"}`, k1, "method and body"},
				{http.MethodPut, "/groups/" + b + "/items", `{"name":"a"}`, k1, "method and path"},
				{http.MethodPut, "/items", `{"name":"b"}`, k1, "method, path and body"},
				{http.MethodPost, "/groups/" + a + "/items", `{"name":"b"}`, k2, "body"},
				{http.MethodPost, "/groups/" + b + "/items", `{"name":"a"}`, k2, "path"},
			} {
				r := do(tt.method, tt.path, tt.body, tt.key)
				require.Equal(t, http.StatusUnprocessableEntity, r.Status, "%s %s %s: %s", tt.method, tt.path, tt.body, r.Body)
				var d problem.Details
				require.NoError(t, json.Unmarshal(r.Body, &d))
				require.Equal(t, idempotency.CodeKeyReused, d.Code)
				require.Equal(t, "Idempotency key has already been used with a different request "+tt.differs+".", d.Detail,
					"%s %s %s", tt.method, tt.path, tt.body)
			}
			// The same request, however its id is spelled, is replayed.
			for _, key := range []string{k1, k2} {
				r := do(http.MethodPost, "/groups/"+upper+"/items", `{ "name": "a" }`, key)
				require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
				require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed))
			}
		})
	}
	require.EqualValues(t, 4, e.items("a"), "two firsts per mode, nothing else done")
	require.Zero(t, e.items("b"))
}

// TestWrapScopesAndTenantsIndependent: the same key in another scope or for
// another tenant is another key.
func TestWrapScopesAndTenantsIndependent(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{})
	other, err := models.NewOrgStore(e.db).Create(context.Background(), "other tenant")
	require.NoError(t, err)

	first := e.do("/items", `{"name":"s"}`, idempotency.HeaderKey, "shared")
	require.Equal(t, http.StatusCreated, first.Status)

	tests := []struct {
		name    string
		path    string
		headers []string
	}{
		{name: "other scope", path: "/other"},
		{name: "other tenant", path: "/items", headers: []string{"X-Tenant", other.ID}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := e.calls.Load()
			r := e.do(tc.path, `{"name":"s"}`, append([]string{idempotency.HeaderKey, "shared"}, tc.headers...)...)
			require.Equal(t, http.StatusCreated, r.Status)
			require.Empty(t, r.Header.Get(idempotency.HeaderReplayed), "not the other scope's or tenant's answer")
			require.Equal(t, calls+1, e.calls.Load(), "executed")
			require.NotEqual(t, first.Body, r.Body)
			// and it replays its own
			r2 := e.do(tc.path, `{"name":"s"}`, append([]string{idempotency.HeaderKey, "shared"}, tc.headers...)...)
			require.Equal(t, "true", r2.Header.Get(idempotency.HeaderReplayed))
			require.Equal(t, r.Body, r2.Body)
		})
	}
	require.EqualValues(t, 3, e.keyRows("shared"))
	require.EqualValues(t, 3, e.items("s"))
}

// TestWrapInProgressRetryAfter: while another transaction holds the key's
// advisory lock the answer is 409 with Retry-After, and nothing is executed.
func TestWrapInProgressRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		retryAfter int
		want       string
	}{
		{name: "default", want: "1"},
		{name: "configured", retryAfter: 7, want: "7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newWrapEnv(t, idempotency.Config{RetryAfter: tc.retryAfter})
			tx := e.db.Begin()
			require.NoError(t, tx.Error)
			defer tx.Rollback()
			require.NoError(t, tx.Exec(`SELECT pg_advisory_xact_lock(?)`, idempotency.LockID(e.org, scopeItems, "busy")).Error)

			r := e.do("/items", `{"name":"busy"}`, idempotency.HeaderKey, `"busy"`)
			require.Equal(t, http.StatusConflict, r.Status)
			require.Equal(t, tc.want, r.Header.Get("Retry-After"))
			require.Equal(t, idempotency.CodeKeyInProgress, code(t, r))
			require.Zero(t, e.calls.Load(), "the handler was not called")
			require.Zero(t, e.keyRows("busy"))

			tx.Rollback()
			r = e.do("/items", `{"name":"busy"}`, idempotency.HeaderKey, "busy")
			require.Equal(t, http.StatusCreated, r.Status)
		})
	}
}

// TestWrapStoresOnlyAllowlistedHeaders: the handler's own answer carries its
// headers, but only Content-Type and Location are stored and replayed.
func TestWrapStoresOnlyAllowlistedHeaders(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{})
	e.mode.Store(modeHeaders)
	r := e.do("/items", `{"name":"h"}`, idempotency.HeaderKey, "hdr")
	require.Equal(t, http.StatusCreated, r.Status)

	var stored string
	require.NoError(t, e.db.Raw(`SELECT response_headers FROM idempotency_keys WHERE key = ?`, "hdr").Scan(&stored).Error)
	var headers map[string]string
	require.NoError(t, json.Unmarshal([]byte(stored), &headers))
	require.Equal(t, map[string]string{"Content-Type": "application/json; charset=utf-8", "Location": "/items/h"}, headers)

	r2 := e.do("/items", `{"name":"h"}`, idempotency.HeaderKey, "hdr")
	require.Equal(t, "true", r2.Header.Get(idempotency.HeaderReplayed))
	for _, h := range []string{"Set-Cookie", "WWW-Authenticate", "Authorization", "X-Internal"} {
		require.Empty(t, r2.Header.Values(h), h)
	}
	require.Equal(t, "/items/h", r2.Header.Get("Location"))
	require.Equal(t, "application/json; charset=utf-8", r2.Header.Get("Content-Type"))
}

// TestWrapTTLAndTimeout: TTL sets expires_at; TxTimeout bounds the request
// transaction, whose timeout is a 503 with nothing stored. Only the request
// that sleeps goes through the wrapper with a 300 ms TxTimeout (X-Short-Tx):
// the others keep the default, whatever the machine's speed.
func TestWrapTTLAndTimeout(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{TTL: time.Hour})

	r := e.do("/items", `{"name":"ttl"}`, idempotency.HeaderKey, "ttl")
	require.Equal(t, http.StatusCreated, r.Status)
	var secs float64
	require.NoError(t, e.db.Raw(`SELECT extract(epoch FROM expires_at - created_at) FROM idempotency_keys WHERE key = 'ttl'`).Scan(&secs).Error)
	require.Equal(t, float64(3600), secs)

	e.mode.Store(modeSleep)
	r = e.do("/items", `{"name":"slow"}`, idempotency.HeaderKey, "slow", "X-Short-Tx", "1")
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "body %s", r.Body)
	require.Equal(t, idempotency.CodeTimeout, code(t, r))
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	require.Zero(t, e.keyRows("slow"))
	require.Zero(t, e.items("slow"))
	require.Equal(t, scopeItems+":"+idempotency.OutcomeError, e.lastOutcome())

	// The timed-out transaction's backend holds the key's lock until it has
	// finished dying, so the retry may first be told 409 with Retry-After:
	// retry as a client should, until a generous bound (a loaded machine
	// may take its time to end that backend).
	e.mode.Store(modeOK)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		r = e.do("/items", `{"name":"slow"}`, idempotency.HeaderKey, "slow")
		if r.Status != http.StatusConflict {
			break
		}
		require.Equal(t, "1", r.Header.Get("Retry-After"))
		time.Sleep(100 * time.Millisecond)
	}
	require.Equal(t, http.StatusCreated, r.Status)
	require.EqualValues(t, 1, e.items("slow"))
}

// TestWrapIgnoresClientCancellation: a request whose client has already hung
// up is still executed and stored, so the retry replays it.
func TestWrapIgnoresClientCancellation(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{})
	e.mode.Store(modeCheckCtx)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := e.doCtx(ctx, "/items", `{"name":"gone"}`, idempotency.HeaderKey, "gone")
	require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
	require.Equal(t, "", e.ctxErr.Load(), "the handler's transaction does not see the client's cancellation")
	require.EqualValues(t, 1, e.items("gone"))
	require.EqualValues(t, 1, e.keyRows("gone"))

	r2 := e.do("/items", `{"name":"gone"}`, idempotency.HeaderKey, "gone")
	require.Equal(t, "true", r2.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, r.Body, r2.Body)
	require.EqualValues(t, 1, e.items("gone"))
}

// TestWrapLostInsertRaceReplaysWinner: a request that missed the fast path,
// got the advisory lock and ran its handler, but finds the key's live row
// committed by another when it saves, undoes its own work and replays the
// winner's answer (the check-then-insert race of docs/design.md's Proof,
// never a 5xx). Here the winner commits while the loser's handler runs,
// without the key's lock: in the service the race is the one of
// begin_keyed.sql, whose look at the key may precede a commit its lock
// then follows; either way no index refuses the loser's row (a key's rows
// are partitioned by expiry, migration 0012). Fails with save_key.sql's
// look at the live row removed (the loser's row and work commit: two rows).
func TestWrapLostInsertRaceReplaysWinner(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{})
	body := `{"name":"race"}`
	canonical, err := canonjson.Canonicalize([]byte(body))
	require.NoError(t, err)
	hash := idempotency.Fingerprint(http.MethodPost, "/items", canonical)

	e.mode.Store(modeGate)
	done := make(chan wrapResp, 1)
	go func() { done <- e.do("/items", body, idempotency.HeaderKey, "race") }()
	require.Eventually(t, func() bool { return e.calls.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the loser runs its handler")

	// The "winner" saves the key and commits.
	require.NoError(t, e.db.Exec(`INSERT INTO idempotency_keys (org_id, endpoint, key, request_hash,
		request_method, request_path, response_status, response_body, response_headers, request_id, expires_at)
		VALUES (?, ?, 'race', ?, 'POST', '/items', 201, ?,
		'{"Content-Type":"application/json"}', 'winner-request', now() + interval '1 hour')`,
		e.org, scopeItems, hash[:], []byte(`{"winner":true}`)).Error)
	close(e.gate)

	r := <-done
	require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
	require.Equal(t, `{"winner":true}`, string(r.Body))
	require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, "winner-request", r.Header.Get(idempotency.HeaderOriginalRequest))
	require.Equal(t, scopeItems+":"+idempotency.OutcomeReplayed, e.lastOutcome())
	require.Zero(t, e.items("race"), "the loser's work was rolled back")
	require.EqualValues(t, 1, e.keyRows("race"))
}

// TestWrapRefusesHugeAnswers: an answer over four times MaxBodyBytes is
// never stored (nor sent): the work rolls back and the request is 413
// response_too_large, counted as rejected; the key stays free.
func TestWrapRefusesHugeAnswers(t *testing.T) {
	t.Parallel()
	e := newWrapEnv(t, idempotency.Config{}) // MaxBodyBytes 0: 1 MiB
	e.mode.Store(modeHuge)
	r := e.do("/items", `{"name":"huge"}`, idempotency.HeaderKey, "huge")
	require.Equal(t, http.StatusRequestEntityTooLarge, r.Status, "body %s", r.Body)
	require.Contains(t, string(r.Body), idempotency.CodeResponseTooLarge)
	require.Less(t, len(r.Body), 1024)
	require.Zero(t, e.items("huge"), "rolled back")
	require.Zero(t, e.keyRows("huge"), "nothing stored")
	require.Equal(t, scopeItems+":"+idempotency.OutcomeRejected, e.lastOutcome())

	e.mode.Store(modeOK)
	r = e.do("/items", `{"name":"huge"}`, idempotency.HeaderKey, "huge")
	require.Equal(t, http.StatusCreated, r.Status, "the key is free")
}
