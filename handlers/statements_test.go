package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
)

// idemTracer records every statement pgx sends on the API's pool, and the
// round trips they take: a statement on its own is one, a batch of
// statements sent together is one. It follows each connection's
// transaction (begin ... commit or rollback) and records every NOTIFY with
// the connection it went on: one sent inside a transaction, where
// PostgreSQL serialises it with every other notifying commit, is kept in
// notifiesInTx.
type idemTracer struct {
	mu         sync.Mutex
	sqls       []string
	roundTrips int
	// batches are the batches begun and not yet ended: a start answered
	// by its key's lock or row is answered before the rest of its batch
	// is read (take waits for it).
	batches      int
	inTx         map[*pgx.Conn]bool
	notifies     int      // NOTIFYs outside any transaction
	notifiesInTx []string // NOTIFYs between a begin and its commit or rollback
}

// idemNotify matches a statement that notifies: pg_notify() or NOTIFY.
var idemNotify = regexp.MustCompile(`(?is)\bpg_notify\s*\(|^\s*notify\b`)

// see follows conn's transaction through sql and records a NOTIFY; it
// reports whether sql notified. The caller holds tr.mu.
func (tr *idemTracer) see(conn *pgx.Conn, sql string) (notified bool) {
	if tr.inTx == nil {
		tr.inTx = map[*pgx.Conn]bool{}
	}
	switch w := strings.ToLower(strings.Fields(sql + " x")[0]); {
	case w == "begin" || w == "start":
		tr.inTx[conn] = true
	case w == "commit" || w == "rollback" || w == "end" || w == "abort":
		tr.inTx[conn] = false
	}
	if !idemNotify.MatchString(sql) {
		return false
	}
	if tr.inTx[conn] {
		tr.notifiesInTx = append(tr.notifiesInTx, sql)
	} else {
		tr.notifies++
	}
	return true
}

func (tr *idemTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.see(conn, data.SQL)
	tr.sqls = append(tr.sqls, data.SQL)
	tr.roundTrips++
	return ctx
}

func (tr *idemTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *idemTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.roundTrips++
	tr.batches++
	return ctx
}

func (tr *idemTracer) TraceBatchQuery(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.see(conn, data.SQL)
	tr.sqls = append(tr.sqls, data.SQL)
}

func (tr *idemTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.batches--
}

func (tr *idemTracer) reset() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.sqls = nil
	tr.roundTrips = 0
	tr.notifiesInTx = nil
}

// notified is how many NOTIFYs were sent outside transactions so far.
func (tr *idemTracer) notified() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.notifies
}

// idemStmtCount is what one request cost in statements and round trips.
type idemStmtCount struct {
	Statements, RoundTrips, Begins, Commits, Rollbacks int
	SQL                                                []string
	// NotifiesInTx are the NOTIFYs sent inside a transaction.
	NotifiesInTx []string
}

func (tr *idemTracer) take() idemStmtCount {
	// A request answered early leaves its batch's last statement to be
	// read: wait until every batch has ended (a generous bound).
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		tr.mu.Lock()
		open := tr.batches
		tr.mu.Unlock()
		if open == 0 {
			break
		}
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	c := idemStmtCount{Statements: len(tr.sqls), RoundTrips: tr.roundTrips, SQL: tr.sqls, NotifiesInTx: tr.notifiesInTx}
	for _, q := range tr.sqls {
		switch w := strings.ToLower(strings.Fields(q + " x")[0]); {
		case w == "begin" || strings.HasPrefix(w, "start"):
			c.Begins++
		case w == "commit":
			c.Commits++
		case w == "rollback":
			c.Rollbacks++
		}
	}
	tr.sqls = nil
	tr.roundTrips = 0
	tr.notifiesInTx = nil
	return c
}

var idemSpaces = regexp.MustCompile(`\s+`)

// TestStatementsPerRequest measures what each kind of start costs the
// database: a start, with a key or without, is one statement (with its
// settings, in the same round trip) in autocommit: no BEGIN, no COMMIT, no
// NOTIFY, one round trip; a retry of a key the process answered lately (a
// replay, a 422, a 409 while in flight) is one read, and the same retry
// reaching a process that never saw the key is that one statement too,
// which finds the key's row (or its lock) and writes nothing.
func TestStatementsPerRequest(t *testing.T) {
	t.Parallel()
	tr := &idemTracer{}
	e := apitest.New(t, apitest.Options{Tracer: tr}) // the auth cache stays on, as in production
	org := e.NewOrg("acme")
	wf := e.NewWorkflow(org, idemWorkflowBody)
	wf2 := e.NewWorkflow(org, `{"name":"other"}`)
	start := func(body string, headers ...string) apitest.Response {
		return e.Do(http.MethodPost, idemStartPath(wf), org.Token, body, headers...)
	}
	// The in-flight key's advisory lock is held on a connection the tracer does not see.
	idemHoldKeyLock(t, e, org.ID, handlers.ScopeWorkflowStart, "busy")
	// A second API process on the same database.
	otherAPI := handlers.New(handlers.Deps{Config: e.Config, DB: e.DB})
	other := func(body string, headers ...string) apitest.Response {
		req := httptest.NewRequest(http.MethodPost, idemStartPath(wf), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+org.Token)
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		rec := httptest.NewRecorder()
		otherAPI.ServeHTTP(rec, req)
		return apitest.Response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
	}
	// Its auth cache and statement caches warm up with a start of its own.
	require.Equal(t, http.StatusCreated, other(idemBody).Status)
	require.Equal(t, http.StatusCreated, other(idemBody, idemKey("other-warm")...).Status)

	// Warm up: the auth cache and each connection's statement cache.
	for i := range 3 {
		require.Equal(t, http.StatusCreated, start(idemBody).Status)
		require.Equal(t, http.StatusCreated, start(idemBody, idemKey(fmt.Sprintf("warm-%d", i))...).Status)
		require.Equal(t, http.StatusCreated, start(idemBody, idemKey(fmt.Sprintf("warm-%d", i))...).Status)
		require.Equal(t, http.StatusConflict, start(idemBody, idemKey("busy")...).Status)
		require.Equal(t, http.StatusUnprocessableEntity, start(idemBodyB, idemKey(fmt.Sprintf("warm-%d", i))...).Status)
	}

	cases := []struct {
		name       string
		send       func() apitest.Response
		status     int
		maxStmts   int // 0: no limit
		maxTrips   int // 0: no limit
		maxBegins  int
		maxCommits int
		// statements: the names of the statements it sends, in order, as
		// models.Statement loads them (nil: not checked).
		statements []string
	}{
		// The batch's settings (models.startSettingsSQL), with a key the key's
		// lock (models.startLocksSQL), and the start (models.startBatchSQL),
		// sent together.
		{name: "no-key start", status: 201, maxStmts: 2, maxTrips: 1,
			statements: []string{"start_settings", "start_batch"},
			send:       func() apitest.Response { return start(idemBody) }},
		{name: "new-key start", status: 201, maxStmts: 3, maxTrips: 1,
			statements: []string{"start_settings", "start_locks", "start_batch"},
			send:       func() apitest.Response { return start(idemBody, idemKey("measured")...) }},
		// A retry of a key this process answered is answered from its cache
		// of answers (docs/design.md, Replays): no statement at all, the
		// same for a 422.
		{name: "replay", status: 201, statements: []string{},
			send: func() apitest.Response { return start(idemBody, idemKey("measured")...) }},
		// The fast path sees the holder in pg_locks: one statement, no transaction
		// (docs/design.md, #proof: a hot key is answered from one indexed read).
		{name: "409 in flight", status: 409, maxStmts: 1,
			send: func() apitest.Response { return start(idemBody, idemKey("busy")...) }},
		{name: "422 mismatch", status: 422, statements: []string{},
			send: func() apitest.Response { return start(idemBodyB, idemKey("measured")...) }},
		{name: "422 other workflow", status: 422, statements: []string{},
			send: func() apitest.Response {
				return e.Do(http.MethodPost, idemStartPath(wf2), org.Token, idemBody, idemKey("measured")...)
			}},
		// Another process, which never answered these keys: the start's
		// keys' statement (models.startLocksSQL) finds the key's row, or its
		// lock taken, and the start's own, sent with it, writes nothing.
		{name: "replay, other process", status: 201, maxStmts: 3, maxTrips: 1,
			send: func() apitest.Response { return other(idemBody, idemKey("measured")...) }},
		{name: "409, other process", status: 409, maxStmts: 3, maxTrips: 1,
			send: func() apitest.Response { return other(idemBody, idemKey("busy")...) }},
	}
	results := make([]idemStmtCount, len(cases))
	// rows are what a request wrote: runs, runs listed as unfinished (for
	// the sweeper), key rows, runs billed.
	type rows struct{ runs, listed, keys, billed int64 }
	count := func() rows {
		var r rows
		require.NoError(t, e.DB.Raw(`SELECT (SELECT count(*) FROM validation_runs), (SELECT count(*) FROM unfinished_runs),
			(SELECT count(*) FROM idempotency_keys), (SELECT coalesce(sum(runs), 0) FROM usage_slots)`).Row().Scan(&r.runs, &r.listed, &r.keys, &r.billed))
		return r
	}
	written := make([]rows, len(cases))
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := count()
			tr.reset()
			r := tc.send()
			c := tr.take()
			results[i] = c
			after := count()
			written[i] = rows{after.runs - before.runs, after.listed - before.listed, after.keys - before.keys, after.billed - before.billed}
			want := rows{}
			switch tc.name {
			case "no-key start":
				want = rows{runs: 1, listed: 1, billed: 1}
			case "new-key start":
				want = rows{runs: 1, listed: 1, keys: 1, billed: 1}
			}
			require.Equal(t, want, written[i], "rows written (runs, runs listed, key rows, runs billed)")
			require.Equal(t, tc.status, r.Status, "body %s", r.Body)
			if tc.statements != nil {
				var want []string
				for _, name := range tc.statements {
					want = append(want, models.Statement(name))
				}
				require.Equal(t, want, c.SQL, "the statements sent, by name: %q", tc.statements)
			}
			// docs/design.md (#proof): a NOTIFY in the request's transaction serialises the
			// commits of every notifying transaction, cluster-wide.
			require.Empty(t, c.NotifiesInTx, "no statement of a request notifies inside its transaction")
			if tc.status == 201 && tc.name == "replay" {
				require.Equal(t, "true", r.Header.Get(idempotency.HeaderReplayed))
			}
			if tc.maxStmts > 0 {
				require.LessOrEqual(t, c.Statements, tc.maxStmts, "statements: %q", c.SQL)
				require.Zero(t, c.Begins, "no transaction")
			}
			if tc.maxTrips > 0 {
				require.LessOrEqual(t, c.RoundTrips, tc.maxTrips, "round trips: %q", c.SQL)
			}
			if tc.maxBegins > 0 {
				require.LessOrEqual(t, c.Begins, tc.maxBegins, "transactions: %q", c.SQL)
			}
			if tc.maxCommits > 0 {
				require.LessOrEqual(t, c.Commits, tc.maxCommits, "commits: %q", c.SQL)
			}
			if tc.maxCommits < 0 {
				require.Zero(t, c.Commits, "nothing committed: %q", c.SQL)
			}
		})
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\n%-22s %10s %11s %6s %7s %9s %5s %7s %9s %7s\n", "request", "statements", "round trips", "begins", "commits", "rollbacks",
		"runs", "listed", "key rows", "billed")
	for i, tc := range cases {
		c, w := results[i], written[i]
		fmt.Fprintf(&b, "%-22s %10d %11d %6d %7d %9d %5d %7d %9d %7d\n", tc.name, c.Statements, c.RoundTrips, c.Begins, c.Commits, c.Rollbacks,
			w.runs, w.listed, w.keys, w.billed)
	}
	t.Log(b.String())
	// docs/design.md (#proof): no NOTIFY at all, inside a transaction or after it.
	require.Zero(t, tr.notified(), "no statement of a request notifies")
	require.True(t, idemNotify.MatchString("SELECT pg_notify('c', 'x')"), "the tracer would see a NOTIFY")
	noKey, newKey := results[0], results[1]
	t.Logf("a new key costs %d statements and %d round trips more than no key, %d more commits",
		newKey.Statements-noKey.Statements, newKey.RoundTrips-noKey.RoundTrips, newKey.Commits-noKey.Commits)
	require.Equal(t, noKey.Commits, newKey.Commits, "a key adds no commit")
	require.LessOrEqual(t, newKey.RoundTrips, noKey.RoundTrips, "a key adds no round trip")
	for i, q := range newKey.SQL {
		t.Logf("new-key start, statement %d: %s", i+1, idemSpaces.ReplaceAllString(strings.TrimSpace(q), " "))
	}
}
