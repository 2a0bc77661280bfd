package main

// The measured scenarios: valruns serve (alone or with a worker draining)
// and the Node peer, each on a fresh database, warmed up, then measured.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// kind is what the load sends.
type kind int

const (
	noKey    kind = iota // starts without Idempotency-Key
	newKey               // a key never used before, per request
	replay               // each client re-sends its one finished key
	hotKey               // every client re-sends one finished key
	orgs100              // new key, requests spread over 100 organisations
	quotaOrg             // new key, on an organisation with a quota
)

// scenario is one row group of the table.
type scenario struct {
	Name   string
	Kind   kind
	Worker bool // valruns: a `valruns worker` drains while the starts arrive
	Peer   bool // the Node peer instead of valruns
	// Tracing: valruns's OpenTelemetry tracing, off or on (tracing.go).
	Tracing tracing
}

func (s scenario) target() string {
	if s.Peer {
		return "peer"
	}
	return "valruns"
}

var valrunsScenarios = []scenario{
	{Name: "start, no key", Kind: noKey},
	{Name: "start, new key", Kind: newKey},
	{Name: "replay", Kind: replay},
	{Name: "hot key", Kind: hotKey},
	{Name: "new key, 100 orgs", Kind: orgs100},
	{Name: "new key, org with quota", Kind: quotaOrg},
	{Name: "new key, serve + worker", Kind: newKey, Worker: true},
}

var peerScenarios = []scenario{
	{Name: "start, no key", Kind: noKey, Peer: true},
	{Name: "start, new key", Kind: newKey, Peer: true},
	{Name: "replay", Kind: replay, Peer: true},
	{Name: "hot key", Kind: hotKey, Peer: true},
}

// row is one measured run in the table.
type row struct {
	Section  string // valruns, peer, pgbench
	Scenario string
	Clients  int
	RPS      float64
	P50      time.Duration
	P99      time.Duration
	P999     time.Duration
	Errors   int // transport errors
	Non2xx   int
	Unexpect int
	// CPUPerReq is the server process's CPU time per completed request
	// (the worker's is WorkerCPUPerReq).
	CPUPerReq       time.Duration
	WorkerCPUPerReq time.Duration
	PeakRSSKB       int64
	DBConns         int // the most connections the database saw from the server
	DBBusy          int // ... of them busy at once
	Notes           []string
	// CappedAt: pgbench ran with this many clients, fewer than Clients
	// (max_connections, or the usage slots of the captured fast path).
	CappedAt int
	Failed   string // the run could not be made
}

// mergeRounds is one row for a scenario's rounds at one count (one run
// each, fresh database and processes): rps, latencies and CPU are their
// means, peak RSS and connections the largest, errors their sums, and the
// notes the first round's, after each round's rps. A round that failed
// fails the row: a mean never hides a failed run.
func mergeRounds(rs []row) row {
	if len(rs) == 1 {
		return rs[0]
	}
	m := rs[0]
	rps := make([]string, len(rs))
	for i, r := range rs {
		rps[i] = fmt.Sprintf("%.0f", r.RPS)
		if r.Failed != "" {
			m.Failed = fmt.Sprintf("round %d of %d: %s", i+1, len(rs), r.Failed)
			return m
		}
	}
	mean := func(f func(row) time.Duration) time.Duration {
		var sum time.Duration
		for _, r := range rs {
			sum += f(r)
		}
		return sum / time.Duration(len(rs))
	}
	m.RPS = 0
	for i, r := range rs {
		m.RPS += r.RPS / float64(len(rs))
		if i == 0 {
			continue
		}
		m.Errors += r.Errors
		m.Non2xx += r.Non2xx
		m.Unexpect += r.Unexpect
		m.PeakRSSKB = max(m.PeakRSSKB, r.PeakRSSKB)
		m.DBConns = max(m.DBConns, r.DBConns)
		m.DBBusy = max(m.DBBusy, r.DBBusy)
	}
	m.P50 = mean(func(r row) time.Duration { return r.P50 })
	m.P99 = mean(func(r row) time.Duration { return r.P99 })
	m.P999 = mean(func(r row) time.Duration { return r.P999 })
	m.CPUPerReq = mean(func(r row) time.Duration { return r.CPUPerReq })
	m.WorkerCPUPerReq = mean(func(r row) time.Duration { return r.WorkerCPUPerReq })
	m.Notes = append([]string{fmt.Sprintf("mean of %d rounds: %s rps (the notes after this: round 1)", len(rs), strings.Join(rps, ", "))}, rs[0].Notes...)
	return m
}

// timing is how long to warm up and measure.
type timing struct {
	Warm, Dur time.Duration
}

// headerFor is the header of a request of org, with key ("" for none).
func headerFor(token, key string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return h
}

// runHTTP measures one scenario at one concurrency on a fresh database.
func (e *env) runHTTP(ctx context.Context, sc scenario, clients int, t timing) row {
	r := row{Section: sc.target(), Scenario: sc.Name, Clients: clients}
	fail := func(err error) row {
		r.Failed = err.Error()
		fmt.Fprintf(os.Stderr, "bench: %s %s c=%d: %v\n", r.Section, sc.Name, clients, err)
		return r
	}
	db, err := e.fresh(ctx)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	if err := e.flushRedis(ctx); err != nil {
		return fail(err)
	}

	traceEnv, rcv, err := tracingEnv(sc.Tracing)
	if err != nil {
		return fail(err)
	}
	if rcv != nil {
		defer rcv.Close() // after the processes stopped (and flushed)
	}
	var srv, worker *proc
	var base string
	if sc.Peer {
		srv, base, err = e.startPeer(ctx, db)
	} else {
		srv, base, err = e.startServer(ctx, db, false, traceEnv...)
	}
	if err != nil {
		return fail(err)
	}
	defer srv.Stop(20 * time.Second)
	if sc.Worker {
		if worker, err = e.startWorkerBin(ctx, e.bin, e.dbURL(db), traceEnv...); err != nil {
			return fail(err)
		}
		defer worker.Stop(20 * time.Second)
	}

	next, check, err := e.requests(ctx, sc, base, clients)
	if err != nil {
		return fail(err)
	}
	sm := &usageMeter{pid: srv.Pid()}
	self := &usageMeter{pid: os.Getpid()} // the load generator's own cost
	var wm *usageMeter
	if worker != nil {
		wm = &usageMeter{pid: worker.Pid()}
	}
	var conns *connsSampler
	res := runLoad(ctx, clients, t.Warm, t.Dur, next, check, nil, func(open bool) {
		if open {
			sm.open()
			self.open()
			if wm != nil {
				wm.open()
			}
			conns = e.sampleConns(ctx, db)
			return
		}
		sm.close()
		self.close()
		if wm != nil {
			wm.close()
		}
		conns.finish()
	})
	if srv.Exited() {
		return fail(fmt.Errorf("the server exited during the run: %v\n%s", srv.err, srv.Tail()))
	}
	r.fillServer(res, sm)
	if res.Requests > 0 && wm != nil {
		r.WorkerCPUPerReq = wm.usage.CPU / time.Duration(res.Requests)
	}
	r.DBConns, r.DBBusy = conns.max, conns.busy
	if res.Requests > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("load generator %s ms CPU/req", ms3(self.usage.CPU/time.Duration(res.Requests))))
	}
	if rcv != nil {
		r.Notes = append(r.Notes, tracingNote(rcv, res.Requests))
	}
	if wm != nil {
		if n, err := e.finishedRuns(ctx, db); err == nil {
			r.Notes = append(r.Notes, fmt.Sprintf("worker finished %d runs by the end (%.0f/s)", n, float64(n)/(t.Warm+t.Dur).Seconds()))
		}
		r.Notes = append(r.Notes, fmt.Sprintf("worker %s ms CPU/req, peak RSS %d MB", ms3(r.WorkerCPUPerReq), wm.usage.PeakRSS/1024))
	}
	return r
}

func (r *row) fill(res loadResult) {
	r.RPS = res.RPS()
	r.P50, r.P99, r.P999 = res.Percentile(0.50), res.Percentile(0.99), res.Percentile(0.999)
	r.Errors, r.Non2xx, r.Unexpect = res.Errors, res.Non2xx, res.Unexpected
	if len(res.Statuses) > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("non-2xx by status: %v", res.Statuses))
	}
	if res.FirstError != "" {
		r.Notes = append(r.Notes, "first error: "+short(res.FirstError, 160))
	}
}

// fillServer is fill plus the server's CPU per request and peak memory,
// measured by m over the same window.
func (r *row) fillServer(res loadResult, m *usageMeter) {
	r.fill(res)
	if res.Requests > 0 {
		r.CPUPerReq = m.usage.CPU / time.Duration(res.Requests)
	}
	r.PeakRSSKB = m.usage.PeakRSS
}

// finishedRuns counts the runs a worker took through to the end.
func (e *env) finishedRuns(ctx context.Context, db string) (int, error) {
	conn, err := e.connect(ctx, db)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs WHERE status IN ('passed', 'failed', 'error')`).Scan(&n)
	return n, err
}

// requests builds what each client sends in a scenario, and sends the
// first request of the keys a replay scenario re-sends.
func (e *env) requests(ctx context.Context, sc scenario, base string, clients int) (requestFunc, checkFunc, error) {
	org := e.orgs[0]
	if sc.Kind == quotaOrg {
		org = e.quotaOrg
	}
	token := org.Token
	if sc.Peer {
		token = "" // the peer has no authentication
	}
	body := []byte(startBody)
	url := base + org.startPath()
	run := time.Now().UnixNano()
	notReplayed := func(resp *http.Response) string {
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			return "a new key was answered as a replay"
		}
		return ""
	}
	replayed := func(resp *http.Response) string {
		if resp.Header.Get("Idempotent-Replayed") != "true" {
			return "a finished key was executed again (no Idempotent-Replayed: true)"
		}
		return ""
	}
	if sc.Peer {
		// express-idempotency marks no replay; its status is all there is to check.
		notReplayed, replayed = nil, nil
	}
	switch sc.Kind {
	case noKey:
		h := headerFor(token, "")
		return func(c, i int) request { return request{http.MethodPost, url, h, body} }, notReplayed, nil
	case newKey, quotaOrg:
		return func(c, i int) request {
			return request{http.MethodPost, url, headerFor(token, fmt.Sprintf("new-%d-%d-%d", run, c, i)), body}
		}, notReplayed, nil
	case orgs100:
		urls := make([]string, len(e.orgs))
		for i, o := range e.orgs {
			urls[i] = base + o.startPath()
		}
		return func(c, i int) request {
			o := (c + i) % len(e.orgs)
			return request{http.MethodPost, urls[o], headerFor(e.orgs[o].Token, fmt.Sprintf("org-%d-%d-%d", run, c, i)), body}
		}, notReplayed, nil
	case replay:
		hs := make([]http.Header, clients)
		for c := range clients {
			hs[c] = headerFor(token, fmt.Sprintf("replay-%d-%d", run, c))
		}
		if err := firstSends(ctx, url, body, hs); err != nil {
			return nil, nil, err
		}
		return func(c, i int) request { return request{http.MethodPost, url, hs[c], body} }, replayed, nil
	case hotKey:
		h := headerFor(token, fmt.Sprintf("hot-%d", run))
		if err := firstSends(ctx, url, body, []http.Header{h}); err != nil {
			return nil, nil, err
		}
		return func(c, i int) request { return request{http.MethodPost, url, h, body} }, replayed, nil
	}
	return nil, nil, fmt.Errorf("unknown scenario kind %d", sc.Kind)
}

// firstSends sends each key's first request (a 201) before the replays.
func firstSends(ctx context.Context, url string, body []byte, hs []http.Header) error {
	hc := newHTTPClient(8)
	defer hc.CloseIdleConnections()
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		mu    sync.Mutex
		first error
	)
	for range min(8, len(hs)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(hs) {
					return
				}
				err := sendOnce(ctx, hc, url, body, hs[i])
				if err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// sendOnce sends a keyed start until it is answered 201: a 503 (the box
// too busy to hand out a connection in time), a 409 (its own retry still
// in flight) or a 429 rate_limited (the organisation's start rate, which
// stores nothing) is retried with the same key after Retry-After (at most
// 2 s; else 200 ms), as a client would.
func sendOnce(ctx context.Context, hc *http.Client, url string, body []byte, h http.Header) error {
	for try := 1; ; try++ {
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytesReader(body))
		if err != nil {
			return err
		}
		r.Header = h.Clone()
		resp, err := hc.Do(r)
		if err != nil {
			return err
		}
		b := readAll(resp)
		switch {
		case resp.StatusCode == http.StatusCreated:
			return nil
		case (resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusConflict ||
			problemCode(b) == "rate_limited") && try < 20:
			wait := 200 * time.Millisecond
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
				wait = min(time.Duration(s)*time.Second, 2*time.Second)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		default:
			return fmt.Errorf("first request of a key: %d %s", resp.StatusCode, short(string(b), 200))
		}
	}
}

// problemCode is the code of a problem document ("" when body is not one).
func problemCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Code
}

// startPeer runs the Node peer on database db.
func (e *env) startPeer(ctx context.Context, db string) (*proc, string, error) {
	return e.startPeerURL(ctx, e.dbURL(db))
}

// startPeerURL runs the Node peer on the database at dbURL (no worker: the
// start measurements leave its queue to grow, as valruns' leave queued runs).
func (e *env) startPeerURL(ctx context.Context, dbURL string) (*proc, string, error) {
	return e.startPeerOpts(ctx, dbURL, e.orgs[0], false)
}

// startPeerOpts runs the Node peer for org on the database at dbURL, with
// its BullMQ worker in the same process when worker.
func (e *env) startPeerOpts(ctx context.Context, dbURL string, org benchOrg, worker bool) (*proc, string, error) {
	addr := fmt.Sprintf("127.0.0.1:%d", e.port+1)
	kv := []string{"PORT=" + fmt.Sprint(e.port+1), "HOST=127.0.0.1", "DATABASE_URL=" + dbURL,
		"REDIS_URL=" + e.redisURL, "ORG_ID=" + org.ID, "NODE_ENV=production"}
	if worker {
		kv = append(kv, "PEER_WORKER=1")
	}
	p, err := startProc("peer", e.logDir, e.peerDir(), childEnv(kv...), "node", "server.js")
	if err != nil {
		return nil, "", err
	}
	base := "http://" + addr
	if err := p.waitHTTP(base+"/healthz", 30*time.Second); err != nil {
		p.Stop(5 * time.Second)
		return nil, "", err
	}
	return p, base, nil
}

// startPeerWorker runs the peer's BullMQ worker as a process of its own
// (node worker.js), its health check on the harness's third port.
func (e *env) startPeerWorker(ctx context.Context, dbURL string) (*proc, error) {
	kv := []string{"HEALTH_PORT=" + fmt.Sprint(e.port+2), "HOST=127.0.0.1", "DATABASE_URL=" + dbURL,
		"REDIS_URL=" + e.redisURL, "NODE_ENV=production"}
	p, err := startProc("peer-worker", e.logDir, e.peerDir(), childEnv(kv...), "node", "worker.js")
	if err != nil {
		return nil, err
	}
	if err := p.waitHTTP(fmt.Sprintf("http://127.0.0.1:%d/healthz", e.port+2), 30*time.Second); err != nil {
		p.Stop(5 * time.Second)
		return nil, err
	}
	return p, nil
}

// peerDir is the peer's directory (server.js, worker.js, node_modules),
// under the repository's root the harness runs from.
func (e *env) peerDir() string { return filepath.Join(e.root, "tools", "bench", "peer") }

// threads is pgbench's -j for c clients.
func threads(c int) int { return max(1, min(c, runtime.NumCPU())) }
