package handlers_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// idemFixture is an API on a fresh database with one organisation and one
// workflow, the setting of every idempotency test.
type idemFixture struct {
	e   *apitest.Env
	org apitest.Org
	wf  string
}

const idemWorkflowBody = `{"name":"invoice"}`

// idemBody is the start body the tests send; idemBodySame means the same
// (keys reordered, other whitespace, 1.0 for 1, 1e0 for 1).
const (
	idemBody     = `{"submission":{"total":1,"items":[1,2.5],"name":"x"},"metadata":{"source":"test"}}`
	idemBodySame = "{ \"metadata\" : { \"source\" : \"test\" },\n\t\"submission\": {\"name\":\"x\", \"items\": [1.0, 2.50], \"total\": 1e0} }"
	idemBodyB    = `{"submission":{"total":2},"metadata":{"source":"test"}}`
)

func newIdemFixture(t *testing.T, cfg func(*config.Config)) *idemFixture {
	t.Helper()
	e := apitest.New(t, apitest.Options{Config: cfg})
	org := e.NewOrg("acme")
	f := &idemFixture{e: e, org: org}
	if e.Config.IdempotencyKeyRequired {
		r := e.Do(http.MethodPost, "/api/workflows/", org.Token, idemWorkflowBody, idempotency.HeaderKey, "setup-workflow")
		require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
		f.wf = r.Map(t)["id"].(string)
	} else {
		f.wf = e.NewWorkflow(org, idemWorkflowBody)
	}
	return f
}

func idemStartPath(wf string) string { return "/api/workflows/" + wf + "/start/" }

// start sends a start of the fixture's workflow as its organisation.
func (f *idemFixture) start(body string, headers ...string) apitest.Response {
	return startOn(f.e, f, body, headers...)
}

// startOn is start through api, such as another process's.
func startOn(api *apitest.Env, f *idemFixture, body string, headers ...string) apitest.Response {
	return api.Do(http.MethodPost, idemStartPath(f.wf), f.org.Token, body, headers...)
}

// anotherProcess is the API on the fixture's database as another process
// serves it, its cache of answers empty. A test that expires a key by SQL
// retries through it: the process that answered the key caches the answer
// with the expires_at it was told, and for it no time passed. (In
// production a key expires IDEMPOTENCY_TTL after its answer, long after
// the cache has let go of it: docs/design.md.)
func (f *idemFixture) anotherProcess() *apitest.Env {
	return f.e.WithConfig(func(*config.Config) {})
}

func idemKey(key string, more ...string) []string {
	return append([]string{idempotency.HeaderKey, key}, more...)
}

// idemCounts is everything a start writes for an organisation.
type idemCounts struct {
	Runs, Usage, Audits, Keys int64
}

func idemCount(t *testing.T, e *apitest.Env, q string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, e.DB.Raw(q, args...).Scan(&n).Error)
	return n
}

func (f *idemFixture) counts(t *testing.T, orgID string) idemCounts {
	t.Helper()
	return idemCounts{
		Runs:   idemCount(t, f.e, `SELECT count(*) FROM validation_runs WHERE org_id = ?`, orgID),
		Usage:  idemCount(t, f.e, `SELECT coalesce(sum(runs), 0) FROM usage_slots WHERE org_id = ?`, orgID),
		Audits: idemCount(t, f.e, `SELECT count(*) FROM audit_records WHERE org_id = ? AND action = 'validation_run.start'`, orgID),
		Keys:   idemCount(t, f.e, `SELECT count(*) FROM idempotency_keys WHERE org_id = ? AND endpoint = ?`, orgID, handlers.ScopeWorkflowStart),
	}
}

// storedKey is a row of idempotency_keys as the tests read it, by SQL.
type storedKey struct {
	OrgID, Endpoint, Key, RequestMethod, RequestPath, RequestID, ClientIP, UserAgent string
	RequestHash, ResponseBody                                                        []byte
	ResponseHeaders                                                                  models.JSON
	ResponseStatus                                                                   int
	ValidationRunID                                                                  *string
	CreatedAt, ExpiresAt                                                             time.Time
}

func (storedKey) TableName() string { return "idempotency_keys" }

// idemKeyRow reads a stored key; nil when there is none.
func idemKeyRow(t *testing.T, e *apitest.Env, orgID, endpoint, key string) *storedKey {
	t.Helper()
	var rows []storedKey
	// The newest: an expired row stays beside its successor until its
	// partition is dropped (migration 0012).
	require.NoError(t, e.DB.Where("org_id = ? AND endpoint = ? AND key = ?", orgID, endpoint, key).
		Order("expires_at DESC").Find(&rows).Error)
	if len(rows) == 0 {
		return nil
	}
	return &rows[0]
}

func idemRun(t *testing.T, e *apitest.Env, id string) models.ValidationRun {
	t.Helper()
	var r models.ValidationRun
	require.NoError(t, e.DB.Where("id = ?", id).Take(&r).Error)
	return r
}

func idemProblem(t *testing.T, r apitest.Response) problem.Details {
	t.Helper()
	require.Equal(t, problem.ContentType, r.Header.Get("Content-Type"), "body %s", r.Body)
	var d problem.Details
	r.JSON(t, &d)
	return d
}

func idemRunID(t *testing.T, r apitest.Response) string {
	t.Helper()
	id, _ := r.Map(t)["id"].(string)
	require.NotEmpty(t, id, "body %s", r.Body)
	return id
}

// requireExecuted checks that r is a 201 that executed the request, not a replay.
func requireExecuted(t *testing.T, r apitest.Response, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
	require.Empty(t, r.Header.Get(idempotency.HeaderReplayed), msgAndArgs...)
}

// requireReplay checks that r is first replayed byte for byte.
func requireReplay(t *testing.T, first, r apitest.Response, originalRequestID string) {
	t.Helper()
	require.Equal(t, first.Status, r.Status, "body %s", r.Body)
	require.Equal(t, string(first.Body), string(r.Body), "the body byte for byte")
	require.Equal(t, first.Header.Get("Content-Type"), r.Header.Get("Content-Type"))
	require.Equal(t, first.Header.Get("Location"), r.Header.Get("Location"))
	require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed))
	require.Equal(t, originalRequestID, r.Header.Get(idempotency.HeaderOriginalRequest))
	require.NotEqual(t, originalRequestID, r.Header.Get("X-Request-Id"), "the replay has its own request id")
}

// idemLockUsage locks every usage slot of the organisation (a prior start
// created them) from a connection of its own, in an open transaction, until
// release (also at cleanup). A start then finds no free slot and blocks
// inside its transaction, waiting for one.
func idemLockUsage(t *testing.T, e *apitest.Env, orgID string) (release func()) {
	t.Helper()
	db, err := sql.Open("pgx", e.DBURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	tx, err := db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	var slots int
	require.NoError(t, tx.QueryRow(`SELECT count(*) FROM (SELECT 1 FROM usage_slots WHERE org_id = $1 FOR UPDATE) s`, orgID).Scan(&slots))
	require.Equal(t, models.UsageSlots, slots, "a prior start created the usage slots")
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(release)
	return release
}

// idemHoldKeyLock holds the advisory lock of a scoped key from a connection of
// its own, as a request in flight does, until release (also at cleanup).
func idemHoldKeyLock(t *testing.T, e *apitest.Env, orgID, scope, key string) (release func()) {
	t.Helper()
	db, err := sql.Open("pgx", e.DBURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	tx, err := db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	_, err = tx.Exec(`SELECT pg_advisory_xact_lock($1)`, idempotency.LockID(orgID, scope, key))
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(release)
	return release
}

// idemWaitLockWaiter waits until a backend of the env's database waits on a
// lock (a request blocked inside its transaction).
func idemWaitLockWaiter(t *testing.T, e *apitest.Env) {
	t.Helper()
	apitest.Eventually(t, 10*time.Second, func() bool {
		return idemCount(t, e, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	}, "a request waiting on a lock")
}

// TestIdempotencyContract is the idempotency table of docs/api.md
// (#idempotency), one row per situation, through the real router.
func TestIdempotencyContract(t *testing.T) {
	t.Parallel()
	rows := []struct {
		name string
		run  func(t *testing.T)
	}{
		{
			name: "no key, optional mode: processed normally, nothing stored",
			run: func(t *testing.T) {
				f := newIdemFixture(t, nil)
				r := f.start(idemBody)
				requireExecuted(t, r)
				require.Equal(t, idemCounts{Runs: 1, Usage: 1, Audits: 1, Keys: 0}, f.counts(t, f.org.ID))
				require.Nil(t, idemRun(t, f.e, idemRunID(t, r)).IdempotencyKey)
				// Without a key every request executes.
				r2 := f.start(idemBody)
				require.Equal(t, http.StatusCreated, r2.Status)
				require.NotEqual(t, idemRunID(t, r), idemRunID(t, r2))
				require.Equal(t, idemCounts{Runs: 2, Usage: 2, Audits: 2, Keys: 0}, f.counts(t, f.org.ID))
				require.Zero(t, idemCount(t, f.e, `SELECT count(*) FROM idempotency_keys`))
			},
		},
		{
			name: "no key, IDEMPOTENCY_KEY_REQUIRED=true: 400 idempotency_key_missing, nothing stored",
			run: func(t *testing.T) {
				f := newIdemFixture(t, func(c *config.Config) { c.IdempotencyKeyRequired = true })
				r := f.start(idemBody)
				require.Equal(t, http.StatusBadRequest, r.Status)
				d := idemProblem(t, r)
				require.Equal(t, idempotency.CodeKeyMissing, d.Code)
				require.Equal(t, http.StatusBadRequest, d.Status)
				require.NotEmpty(t, d.Type)
				require.NotEmpty(t, d.Title)
				require.NotEmpty(t, d.Detail)
				require.Equal(t, idemCounts{}, f.counts(t, f.org.ID))
				// The create route too.
				r = f.e.Do(http.MethodPost, "/api/workflows/", f.org.Token, idemWorkflowBody)
				require.Equal(t, http.StatusBadRequest, r.Status)
				require.Equal(t, idempotency.CodeKeyMissing, idemProblem(t, r).Code)
				require.EqualValues(t, 1, idemCount(t, f.e, `SELECT count(*) FROM workflows`), "only the keyed setup workflow")
				// With a key it is processed.
				r = f.start(idemBody, idemKey("required-1")...)
				require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
				require.Equal(t, idemCounts{Runs: 1, Usage: 1, Audits: 1, Keys: 1}, f.counts(t, f.org.ID))
			},
		},
		{
			name: "key empty, too long, or not printable ASCII: 400 idempotency_key_invalid / idempotency_key_too_long",
			run: func(t *testing.T) {
				f := newIdemFixture(t, nil)
				const tooLong = "Idempotency key exceeds maximum length of 255 characters."
				bad := []struct {
					name, code, detail string
					headers            []string
				}{
					{name: "empty", code: idempotency.CodeKeyInvalid, headers: idemKey("")},
					{name: "only whitespace", code: idempotency.CodeKeyInvalid, headers: idemKey("   ")},
					{name: "empty quoted", code: idempotency.CodeKeyInvalid, headers: idemKey(`""`)},
					{name: "256 characters", code: idempotency.CodeKeyTooLong, detail: tooLong, headers: idemKey(strings.Repeat("k", 256))},
					{name: "256 characters quoted", code: idempotency.CodeKeyTooLong, detail: tooLong, headers: idemKey(`"` + strings.Repeat("k", 256) + `"`)},
					{name: "control character", code: idempotency.CodeKeyInvalid, headers: idemKey("abc\x01def")},
					{name: "DEL", code: idempotency.CodeKeyInvalid, headers: idemKey("abc\x7f")},
					{name: "non-ASCII", code: idempotency.CodeKeyInvalid, headers: idemKey("clé-1")},
					{name: "unterminated quote", code: idempotency.CodeKeyInvalid, headers: idemKey(`"abc`)},
					{name: "two headers", code: idempotency.CodeKeyInvalid, headers: idemKey("a", idempotency.HeaderKey, "b")},
				}
				for _, tc := range bad {
					t.Run(tc.name, func(t *testing.T) {
						r := f.start(idemBody, tc.headers...)
						require.Equal(t, http.StatusBadRequest, r.Status, "body %s", r.Body)
						d := idemProblem(t, r)
						require.Equal(t, tc.code, d.Code)
						if tc.detail != "" {
							require.Equal(t, tc.detail, d.Detail)
						}
						require.Equal(t, idemCounts{}, f.counts(t, f.org.ID))
					})
				}
				t.Run("255 characters is accepted and stored", func(t *testing.T) {
					key := strings.Repeat("k", 255)
					r := f.start(idemBody, idemKey(key)...)
					require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
					require.NotNil(t, idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, key))
					// and the quoted form with surrounding whitespace is the same key
					r2 := f.start(idemBody, idemKey(` "`+key+`" `)...)
					requireReplay(t, r, r2, r.Header.Get("X-Request-Id"))
				})
				t.Run(`quoted "abc" and bare abc are the same key`, func(t *testing.T) {
					r := f.start(idemBody, idemKey(`"abc"`)...)
					require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
					r2 := f.start(idemBody, idemKey("abc")...)
					requireReplay(t, r, r2, r.Header.Get("X-Request-Id"))
					require.NotNil(t, idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, "abc"), "stored unquoted")
					require.EqualValues(t, 2, f.counts(t, f.org.ID).Runs, "the 255-character key's run and this one")
				})
			},
		},
		{
			name: "first request with a key: processed, the answer stored with the work and linked to the run",
			run: func(t *testing.T) {
				f := newIdemFixture(t, nil)
				r := f.start(idemBody, idemKey("first-1", "X-Request-Id", "req-first-1", "User-Agent", "contract-test/1")...)
				requireExecuted(t, r)
				require.Equal(t, "req-first-1", r.Header.Get("X-Request-Id"))
				runID := idemRunID(t, r)
				require.Equal(t, "/api/runs/"+runID+"/", r.Header.Get("Location"))
				require.Equal(t, "application/json; charset=utf-8", r.Header.Get("Content-Type"))

				k := idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, "first-1")
				require.NotNil(t, k)
				require.Equal(t, http.StatusCreated, k.ResponseStatus)
				require.Equal(t, string(r.Body), string(k.ResponseBody), "the exact bytes answered")
				var headers map[string]string
				require.NoError(t, json.Unmarshal(k.ResponseHeaders, &headers))
				require.Equal(t, map[string]string{
					"Content-Type": "application/json; charset=utf-8",
					"Location":     "/api/runs/" + runID + "/",
				}, headers, "only the allowlisted headers")
				require.NotNil(t, k.ValidationRunID)
				require.Equal(t, runID, *k.ValidationRunID)
				require.Equal(t, "req-first-1", k.RequestID)
				require.Equal(t, http.MethodPost, k.RequestMethod)
				require.Equal(t, "/api/workflows/"+f.wf+"/start", k.RequestPath)
				require.Equal(t, "contract-test/1", k.UserAgent)
				require.Len(t, k.RequestHash, 32)
				var ttl float64
				require.NoError(t, f.e.DB.Raw(`SELECT extract(epoch FROM expires_at - created_at) FROM idempotency_keys WHERE org_id = ? AND endpoint = ? AND key = ?`, k.OrgID, k.Endpoint, k.Key).Scan(&ttl).Error)
				require.Equal(t, (24 * time.Hour).Seconds(), ttl)
				require.WithinDuration(t, time.Now(), k.CreatedAt, time.Minute)

				run := idemRun(t, f.e, runID)
				require.NotNil(t, run.IdempotencyKey)
				require.Equal(t, k.Key, *run.IdempotencyKey)
				require.Equal(t, idemCounts{Runs: 1, Usage: 1, Audits: 1, Keys: 1}, f.counts(t, f.org.ID))
			},
		},
		{
			name: "first request with a key answered 4xx by the handler: stored and replayed",
			run: func(t *testing.T) {
				f := newIdemFixture(t, nil)
				cases := []struct {
					name, path, body, code string
					status                 int
				}{
					{name: "unknown workflow 404", path: idemStartPath("3f0e7b1c-2a4d-4e5f-8a9b-0c1d2e3f4a5b"), body: idemBody, status: 404, code: "not_found"},
					{name: "malformed workflow id 404", path: idemStartPath("not-a-uuid"), body: idemBody, status: 404, code: "not_found"},
					{name: "submission missing 400", path: idemStartPath(f.wf), body: `{"metadata":{}}`, status: 400, code: "validation_error"},
					{name: "metadata not an object 400", path: idemStartPath(f.wf), body: `{"submission":1,"metadata":[1]}`, status: 400, code: "validation_error"},
					{name: "unknown field 400", path: idemStartPath(f.wf), body: `{"submision":1}`, status: 400, code: "validation_error"},
				}
				for _, tc := range cases {
					t.Run(tc.name, func(t *testing.T) {
						key := "k4xx-" + strings.ReplaceAll(tc.name, " ", "-")
						r := f.e.Do(http.MethodPost, tc.path, f.org.Token, tc.body, idemKey(key)...)
						require.Equal(t, tc.status, r.Status, "body %s", r.Body)
						require.Equal(t, tc.code, idemProblem(t, r).Code)
						k := idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, key)
						require.NotNil(t, k, "a 4xx is stored")
						require.Equal(t, tc.status, k.ResponseStatus)
						require.Nil(t, k.ValidationRunID)
						r2 := f.e.Do(http.MethodPost, tc.path, f.org.Token, tc.body, idemKey(key)...)
						requireReplay(t, r, r2, r.Header.Get("X-Request-Id"))
						// Fixing the body under the same key is another request: 422.
						if tc.body != idemBody {
							r3 := f.e.Do(http.MethodPost, tc.path, f.org.Token, idemBody, idemKey(key)...)
							require.Equal(t, http.StatusUnprocessableEntity, r3.Status)
						}
					})
				}
				require.Equal(t, idemCounts{Keys: int64(len(cases))}, f.counts(t, f.org.ID), "no run, nothing billed")
			},
		},
		{
			name: "first request with a key from an unusual but valid client (Latin-1 or long User-Agent, %FF or long path): stored, never a 5xx",
			run: func(t *testing.T) {
				// Without a key each of these is answered normally; with one,
				// the answer must be storable too, or every retry is a 500.
				f := newIdemFixture(t, nil)
				srv := f.e.Server()
				cases := []struct {
					name, path, ua string
					status         int
				}{
					{name: "Latin-1 User-Agent (obs-text, legal on the wire)", path: idemStartPath(f.wf), ua: "caf\xe9-client/1.0", status: 201},
					{name: "User-Agent over 1000 bytes whose 1000th byte is inside a character", path: idemStartPath(f.wf), ua: strings.Repeat("a", 999) + "é", status: 201},
					{name: "path with %FF", path: "/api/workflows/%FF/start/", ua: "t", status: 404},
					{name: "path over 2000 characters", path: "/api/workflows/" + strings.Repeat("a", 2100) + "/start/", ua: "t", status: 404},
				}
				for i, tc := range cases {
					t.Run(tc.name, func(t *testing.T) {
						key := "odd-" + string(rune('a'+i))
						send := func() apitest.Response {
							req, err := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(idemBody))
							require.NoError(t, err)
							req.Header.Set("Authorization", "Bearer "+f.org.Token)
							req.Header.Set(idempotency.HeaderKey, key)
							req.Header.Set("User-Agent", tc.ua)
							resp, err := http.DefaultClient.Do(req)
							require.NoError(t, err)
							defer resp.Body.Close()
							b, err := io.ReadAll(resp.Body)
							require.NoError(t, err)
							return apitest.Response{Status: resp.StatusCode, Header: resp.Header, Body: b}
						}
						r := send()
						require.Equal(t, tc.status, r.Status, "body %s", r.Body)
						require.NotNil(t, idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, key), "stored")
						requireReplay(t, r, send(), r.Header.Get("X-Request-Id"))
					})
				}
			},
		},
		{
			name: "quota exceeded: 429 quota_exceeded stored like any other answer, usage not bumped past the quota",
			run: func(t *testing.T) {
				f := newIdemFixture(t, func(c *config.Config) {
					c.DefaultMonthlyRunQuota = 1
					c.AuthCacheTTL = 0 // the org quota set below is seen at once
				})
				r := f.start(idemBody, idemKey("q-1")...)
				require.Equal(t, http.StatusCreated, r.Status, "body %s", r.Body)
				r = f.start(idemBody, idemKey("q-2")...)
				require.Equal(t, http.StatusTooManyRequests, r.Status, "body %s", r.Body)
				d := idemProblem(t, r)
				require.Equal(t, "quota_exceeded", d.Code)
				require.Equal(t, "The organisation has used its monthly quota of 1 runs.", d.Detail)
				k := idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, "q-2")
				require.NotNil(t, k)
				require.Equal(t, http.StatusTooManyRequests, k.ResponseStatus)
				require.Nil(t, k.ValidationRunID)
				want := idemCounts{Runs: 1, Usage: 1, Audits: 1, Keys: 2}
				require.Equal(t, want, f.counts(t, f.org.ID))

				r2 := f.start(idemBody, idemKey("q-2")...)
				requireReplay(t, r, r2, r.Header.Get("X-Request-Id"))
				require.Equal(t, want, f.counts(t, f.org.ID), "a replayed 429 bills nothing")

				// A raised quota does not rewrite history: the key keeps its
				// 429, a new key starts a run.
				quota := int64(5)
				require.NoError(t, models.NewOrgStore(f.e.DB).SetQuota(context.Background(), f.org.ID, &quota))
				r3 := f.start(idemBody, idemKey("q-2")...)
				requireReplay(t, r, r3, r.Header.Get("X-Request-Id"))
				r4 := f.start(idemBody, idemKey("q-3")...)
				require.Equal(t, http.StatusCreated, r4.Status, "body %s", r4.Body)
				require.Equal(t, idemCounts{Runs: 2, Usage: 2, Audits: 2, Keys: 3}, f.counts(t, f.org.ID))
			},
		},
		{
			name: "same key, same fingerprint, finished: the stored answer byte for byte, nothing executed or billed again",
			run: func(t *testing.T) {
				f := newIdemFixture(t, nil)
				first := f.start(idemBody, idemKey("replay-1", "X-Request-Id", "orig-req-42")...)
				require.Equal(t, http.StatusCreated, first.Status, "body %s", first.Body)
				after := f.counts(t, f.org.ID)
				require.Equal(t, idemCounts{Runs: 1, Usage: 1, Audits: 1, Keys: 1}, after)

				variants := []struct {
					name, path, body string
					headers          []string
				}{
					{name: "identical request", path: idemStartPath(f.wf), body: idemBody, headers: idemKey("replay-1")},
					{name: "keys reordered, whitespace, 1.0 for 1, 1e0 for 1", path: idemStartPath(f.wf), body: idemBodySame, headers: idemKey("replay-1")},
					{name: "quoted key", path: idemStartPath(f.wf), body: idemBody, headers: idemKey(`"replay-1"`)},
					{name: "path without trailing slash", path: "/api/workflows/" + f.wf + "/start", body: idemBody, headers: idemKey("replay-1")},
					{name: "another request id", path: idemStartPath(f.wf), body: idemBody, headers: idemKey("replay-1", "X-Request-Id", "retry-req-7")},
				}
				for _, v := range variants {
					t.Run(v.name, func(t *testing.T) {
						r := f.e.Do(http.MethodPost, v.path, f.org.Token, v.body, v.headers...)
						requireReplay(t, first, r, "orig-req-42")
						require.Equal(t, after, f.counts(t, f.org.ID), "nothing executed or billed")
					})
				}
			},
		},
		{
			name: "same key, other fingerprint, finished: 422 idempotency_key_reused",
			run: func(t *testing.T) {
				f := newIdemFixture(t, nil)
				wf2 := f.e.NewWorkflow(f.org, `{"name":"second"}`)
				first := f.start(idemBody, idemKey("reuse-1")...)
				require.Equal(t, http.StatusCreated, first.Status, "body %s", first.Body)
				after := f.counts(t, f.org.ID)
				variants := []struct {
					name, path, body, differs string
				}{
					{name: "other submission", path: idemStartPath(f.wf), body: idemBodyB, differs: "body"},
					{name: "other metadata only", path: idemStartPath(f.wf), body: `{"submission":{"total":1,"items":[1,2.5],"name":"x"},"metadata":{"source":"other"}}`, differs: "body"},
					{name: "1 and 1.5 differ", path: idemStartPath(f.wf), body: `{"submission":{"total":1.5,"items":[1,2.5],"name":"x"},"metadata":{"source":"test"}}`, differs: "body"},
					{name: "same body on another workflow (the path is in the fingerprint)", path: idemStartPath(wf2), body: idemBody, differs: "path"},
					{name: "other body on another workflow", path: idemStartPath(wf2), body: idemBodyB, differs: "path and body"},
				}
				for _, v := range variants {
					t.Run(v.name, func(t *testing.T) {
						r := f.e.Do(http.MethodPost, v.path, f.org.Token, v.body, idemKey("reuse-1")...)
						require.Equal(t, http.StatusUnprocessableEntity, r.Status, "body %s", r.Body)
						d := idemProblem(t, r)
						require.Equal(t, idempotency.CodeKeyReused, d.Code)
						require.Equal(t, "Idempotency key has already been used with a different request "+v.differs+".", d.Detail)
						require.Empty(t, r.Header.Get(idempotency.HeaderReplayed))
						require.Equal(t, after, f.counts(t, f.org.ID), "nothing executed or billed")
					})
				}
				require.EqualValues(t, 0, idemCount(t, f.e, `SELECT count(*) FROM validation_runs WHERE workflow_id = ?`, wf2))
				// The original still replays.
				requireReplay(t, first, f.start(idemBody, idemKey("reuse-1")...), first.Header.Get("X-Request-Id"))
			},
		},
		{
			name: "same key while the first is still in flight: 409 idempotency_key_in_progress with Retry-After",
			run: func(t *testing.T) {
				f := newIdemFixture(t, nil)
				release := idemHoldKeyLock(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, "flight-1")
				for _, body := range []string{idemBody, idemBodyB} { // the body cannot be compared yet
					r := f.start(body, idemKey("flight-1")...)
					require.Equal(t, http.StatusConflict, r.Status, "body %s", r.Body)
					d := idemProblem(t, r)
					require.Equal(t, idempotency.CodeKeyInProgress, d.Code)
					require.Equal(t, "A request with this idempotency key is currently being processed.", d.Detail)
					require.Equal(t, "1", r.Header.Get("Retry-After"))
					require.Empty(t, r.Header.Get(idempotency.HeaderReplayed))
				}
				require.Equal(t, idemCounts{}, f.counts(t, f.org.ID), "nothing executed, nothing stored")
				// Another key of the same organisation is not blocked.
				require.Equal(t, http.StatusCreated, f.start(idemBody, idemKey("flight-2")...).Status)

				release()
				r := f.start(idemBody, idemKey("flight-1")...)
				requireExecuted(t, r)
				require.Equal(t, idemCounts{Runs: 2, Usage: 2, Audits: 2, Keys: 2}, f.counts(t, f.org.ID))
			},
		},
		{
			name: "same key in flight, request carries Prefer: wait=N: waits up to min(N, IDEMPOTENCY_MAX_WAIT), then the replay (or 422) with Preference-Applied; past the time or the waiter cap, 409",
			run: func(t *testing.T) {
				t.Run("the duplicate waits and gets the replay", idemScenarioWaitReplay)
				t.Run("the duplicate with another body waits and gets 422", idemScenarioWaitMismatch)
				t.Run("without the preference, or with waiting disabled, 409 at once", idemScenarioWaitNotAsked)
				t.Run("past the waiter cap, 409 at once", idemScenarioWaitCap)
				t.Run("past the time, 409", idemScenarioWaitTimeout)
				t.Run("the first rolls back while the duplicate waits: the duplicate executes, one run", idemScenarioWaitFirstRollsBack)
			},
		},
		{
			name: "the first ended in a 5xx or its client hung up: a 5xx stores nothing, a hang-up stores the answer; always exactly one run",
			run: func(t *testing.T) {
				// A crashed process is TestProc.../crash in process_test.go.
				t.Run("transaction timeout 503 rolls back, the retry executes once", idemScenarioTxTimeout)
				t.Run("client hang-up mid-transaction: the work commits and the retry replays it", idemScenarioClientHangUp)
			},
		},
		{
			name: "key past expires_at: processed as a new request",
			run: func(t *testing.T) {
				f := newIdemFixture(t, nil)
				// expire makes the key's live row 25 hours old and returns
				// another process to retry through (anotherProcess).
				expire := func(key string) *apitest.Env {
					require.NoError(t, f.e.DB.Exec(`UPDATE idempotency_keys SET created_at = now() - interval '25 hours',
						expires_at = now() - interval '1 hour' WHERE org_id = ? AND key = ? AND expires_at > now()`, f.org.ID, key).Error)
					return f.anotherProcess()
				}
				first := f.start(idemBody, idemKey("exp-1")...)
				require.Equal(t, http.StatusCreated, first.Status, "body %s", first.Body)
				run1 := idemRunID(t, first)
				old := idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, "exp-1")
				api := expire("exp-1")

				second := startOn(api, f, idemBody, idemKey("exp-1")...)
				requireExecuted(t, second)
				run2 := idemRunID(t, second)
				require.NotEqual(t, run1, run2, "a second run")

				k := idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowStart, "exp-1")
				require.NotNil(t, k.ValidationRunID)
				require.Equal(t, run2, *k.ValidationRunID, "the key now points to the new run")
				require.NotEqual(t, *old.ValidationRunID, *k.ValidationRunID)
				require.Equal(t, string(second.Body), string(k.ResponseBody))
				require.Equal(t, k.Key, *idemRun(t, f.e, run2).IdempotencyKey)
				require.Equal(t, k.Key, *idemRun(t, f.e, run1).IdempotencyKey, "the old run still names the key that started it")
				// The expired row stays until its day's partition is dropped.
				require.Equal(t, idemCounts{Runs: 2, Usage: 2, Audits: 2, Keys: 2}, f.counts(t, f.org.ID))
				// The new answer replays.
				requireReplay(t, second, startOn(api, f, idemBody, idemKey("exp-1")...), second.Header.Get("X-Request-Id"))

				// An expired key with another body is new too, not 422.
				api = expire("exp-1")
				third := startOn(api, f, idemBodyB, idemKey("exp-1")...)
				requireExecuted(t, third)
				require.Equal(t, idemCounts{Runs: 3, Usage: 3, Audits: 3, Keys: 3}, f.counts(t, f.org.ID))
			},
		},
		{
			name: "same key, other organisation or other endpoint: independent, never another tenant's answer",
			run: func(t *testing.T) {
				f := newIdemFixture(t, nil)
				orgB := f.e.NewOrg("globex")
				wfB := f.e.NewWorkflow(orgB, idemWorkflowBody)

				a := f.start(idemBody, idemKey("shared")...)
				require.Equal(t, http.StatusCreated, a.Status, "body %s", a.Body)
				b := f.e.Do(http.MethodPost, idemStartPath(wfB), orgB.Token, idemBody, idemKey("shared")...)
				requireExecuted(t, b, "not org A's answer")
				require.NotEqual(t, idemRunID(t, a), idemRunID(t, b), "two runs")

				requireReplay(t, a, f.start(idemBody, idemKey("shared")...), a.Header.Get("X-Request-Id"))
				requireReplay(t, b, f.e.Do(http.MethodPost, idemStartPath(wfB), orgB.Token, idemBody, idemKey("shared")...), b.Header.Get("X-Request-Id"))
				require.Equal(t, idemCounts{Runs: 1, Usage: 1, Audits: 1, Keys: 1}, f.counts(t, f.org.ID))
				require.Equal(t, idemCounts{Runs: 1, Usage: 1, Audits: 1, Keys: 1}, f.counts(t, orgB.ID))

				// Org B with the same key on org A's workflow: its own key, another
				// path, so 422; never org A's run. With a fresh key: 404, no leak.
				r := f.e.Do(http.MethodPost, idemStartPath(f.wf), orgB.Token, idemBody, idemKey("shared")...)
				require.Equal(t, http.StatusUnprocessableEntity, r.Status, "body %s", r.Body)
				require.NotContains(t, string(r.Body), idemRunID(t, a))
				r = f.e.Do(http.MethodPost, idemStartPath(f.wf), orgB.Token, idemBody, idemKey("fresh")...)
				require.Equal(t, http.StatusNotFound, r.Status, "body %s", r.Body)

				// The same key on the create endpoint is another scope.
				c := f.e.Do(http.MethodPost, "/api/workflows/", f.org.Token, `{"name":"made with shared"}`, idemKey("shared")...)
				requireExecuted(t, c)
				require.Equal(t, "made with shared", c.Map(t)["name"])
				requireReplay(t, c, f.e.Do(http.MethodPost, "/api/workflows/", f.org.Token, `{"name":"made with shared"}`, idemKey("shared")...), c.Header.Get("X-Request-Id"))
				require.EqualValues(t, 1, idemCount(t, f.e, `SELECT count(*) FROM workflows WHERE name = 'made with shared'`))
				require.NotNil(t, idemKeyRow(t, f.e, f.org.ID, handlers.ScopeWorkflowCreate, "shared"))
				// and the start key still replays its run
				requireReplay(t, a, f.start(idemBody, idemKey("shared")...), a.Header.Get("X-Request-Id"))
			},
		},
		{
			name: "rejected before the handler ran (401, bad key, malformed or empty JSON, a number PostgreSQL cannot store, 413): nothing stored",
			run: func(t *testing.T) {
				f := newIdemFixture(t, func(c *config.Config) { c.MaxBodyBytes = 512 })
				big := `{"submission":"` + strings.Repeat("x", 600) + `"}`
				// 203 bytes that would be stored as 40 numbers of 201 digits.
				amplified := `{"submission":[` + strings.TrimSuffix(strings.Repeat("1e200,", 40), ",") + `]}`
				cases := []struct {
					name   string
					send   func() apitest.Response
					status int
					code   string
				}{
					{name: "no token 401", status: 401, code: "unauthenticated", send: func() apitest.Response {
						return f.e.Do(http.MethodPost, idemStartPath(f.wf), "", idemBody, idemKey("pre-1")...)
					}},
					{name: "unknown token 401", status: 401, code: "invalid_token", send: func() apitest.Response {
						return f.e.Do(http.MethodPost, idemStartPath(f.wf), "vr_nope", idemBody, idemKey("pre-1")...)
					}},
					{name: "bad key 400", status: 400, code: idempotency.CodeKeyInvalid, send: func() apitest.Response {
						return f.start(idemBody, idemKey("pre\x00-1")...)
					}},
					{name: "malformed JSON 400", status: 400, code: idempotency.CodeInvalidJSON, send: func() apitest.Response {
						return f.start(`{"submission":`, idemKey("pre-1")...)
					}},
					{name: "duplicate JSON key 400", status: 400, code: idempotency.CodeInvalidJSON, send: func() apitest.Response {
						return f.start(`{"submission":1,"submission":2}`, idemKey("pre-1")...)
					}},
					{name: "empty body 400", status: 400, code: idempotency.CodeInvalidJSON, send: func() apitest.Response {
						return f.start(``, idemKey("pre-1")...)
					}},
					{name: "body not an object 400", status: 400, code: idempotency.CodeInvalidJSON, send: func() apitest.Response {
						return f.start(`[{"submission":1}]`, idemKey("pre-1")...)
					}},
					{name: "number too large for PostgreSQL 400", status: 400, code: idempotency.CodeInvalidNumber, send: func() apitest.Response {
						return f.start(`{"submission":{"total":1e1000000}}`, idemKey("pre-1")...)
					}},
					{name: "number too small for PostgreSQL, in metadata 400", status: 400, code: idempotency.CodeInvalidNumber, send: func() apitest.Response {
						return f.start(`{"submission":1,"metadata":{"x":1e-1000000}}`, idemKey("pre-1")...)
					}},
					{name: "numbers that would be stored past MAX_BODY_BYTES 413", status: 413, code: idempotency.CodeBodyTooLarge, send: func() apitest.Response {
						return f.start(amplified, idemKey("pre-1")...)
					}},
					{name: "declared body over MAX_BODY_BYTES 413", status: 413, code: idempotency.CodeBodyTooLarge, send: func() apitest.Response {
						return f.start(big, idemKey("pre-1")...)
					}},
					{name: "chunked body over MAX_BODY_BYTES 413", status: 413, code: idempotency.CodeBodyTooLarge, send: func() apitest.Response {
						req := httptest.NewRequest(http.MethodPost, idemStartPath(f.wf), io.MultiReader(strings.NewReader(big)))
						req.ContentLength = -1
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Authorization", "Bearer "+f.org.Token)
						req.Header.Set(idempotency.HeaderKey, "pre-1")
						rec := httptest.NewRecorder()
						f.e.Handler.ServeHTTP(rec, req)
						return apitest.Response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
					}},
				}
				for _, tc := range cases {
					t.Run(tc.name, func(t *testing.T) {
						r := tc.send()
						require.Equal(t, tc.status, r.Status, "body %s", r.Body)
						require.Equal(t, tc.code, idemProblem(t, r).Code)
						require.Zero(t, idemCount(t, f.e, `SELECT count(*) FROM idempotency_keys`), "nothing stored")
						require.Equal(t, idemCounts{}, f.counts(t, f.org.ID))
					})
				}
				// The key was never consumed.
				r := f.start(idemBody, idemKey("pre-1")...)
				requireExecuted(t, r)
			},
		},
		{
			name: "a stored answer never carries Set-Cookie, WWW-Authenticate or other headers",
			run: func(t *testing.T) {
				f := newIdemFixture(t, nil)
				// A 401 carries WWW-Authenticate and is not stored at all.
				r := f.e.Do(http.MethodPost, idemStartPath(f.wf), "vr_nope", idemBody, idemKey("hdr-1")...)
				require.Equal(t, http.StatusUnauthorized, r.Status)
				require.NotEmpty(t, r.Header.Get("WWW-Authenticate"))

				first := f.start(idemBody, idemKey("hdr-1")...)
				require.Equal(t, http.StatusCreated, first.Status)
				nf := f.e.Do(http.MethodPost, idemStartPath("3f0e7b1c-2a4d-4e5f-8a9b-0c1d2e3f4a5b"), f.org.Token, idemBody, idemKey("hdr-2")...)
				require.Equal(t, http.StatusNotFound, nf.Status)

				var all []storedKey
				require.NoError(t, f.e.DB.Find(&all).Error)
				require.Len(t, all, 2)
				for _, k := range all {
					var h map[string]string
					require.NoError(t, json.Unmarshal(k.ResponseHeaders, &h))
					for name := range h {
						require.Contains(t, []string{"Content-Type", "Location"}, name, "key %s stored header %s", k.Key, name)
					}
				}
				for _, key := range []string{"hdr-1", "hdr-2"} {
					path := idemStartPath(f.wf)
					if key == "hdr-2" {
						path = idemStartPath("3f0e7b1c-2a4d-4e5f-8a9b-0c1d2e3f4a5b")
					}
					rr := f.e.Do(http.MethodPost, path, f.org.Token, idemBody, idemKey(key)...)
					require.Equal(t, "true", rr.Header.Get(idempotency.HeaderReplayed))
					for _, h := range []string{"Set-Cookie", "WWW-Authenticate", "Authorization", "Retry-After"} {
						require.Empty(t, rr.Header.Values(h), "%s replayed for %s", h, key)
					}
				}
			},
		},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			row.run(t)
		})
	}
}
