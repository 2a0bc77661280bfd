package reliability

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/validate"
)

// setup is what most scenarios start from: a fresh cluster, an organisation
// and a client on both replicas.
func setup(t *testing.T, s *suite, name string) (*cluster, *client, *recorder, org) {
	t.Helper()
	return setupWith(t, s, name, nil)
}

// setupWith is setup with the children's extra settings env returns (see
// newClusterWith).
func setupWith(t *testing.T, s *suite, name string, env func(*cluster) []string) (*cluster, *client, *recorder, org) {
	t.Helper()
	c := newClusterWith(t, s, 2, 2, env)
	rec := &recorder{}
	cl := newClient(c.baseURLs(), rec, s.cfg.MaxBodyBytes)
	t.Cleanup(cl.close)
	return c, cl, rec, c.newOrg(name)
}

// retryStorm: 20 keys, each sent by 10 goroutines at once through both
// replicas, each goroutine retrying until its definitive answer and then
// sending it twice more. Each key must make exactly one run, executed by
// exactly one request; every other answer is the replay of the same bytes
// or a 409 while in flight; the same key with another body is a 422.
func retryStorm(t *testing.T, s *suite, res *result) {
	c, cl, rec, o := setup(t, s, "storm")
	ops := sameKeyStorm(t, c, cl, res, o)
	verify(t, c, res, ops, expectations{})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil) // no fault: no 5xx at all
}

// sameKeyStorm is retry_storm's load and its checks of the answers, on
// organisation o; it returns the operations for verify.
func sameKeyStorm(t *testing.T, c *cluster, cl *client, res *result, o org) []*op {
	def := orderWorkflow()
	wf := createWorkflow(t, cl, o, def)
	const keys, perKey, sends = 20, 10, 3
	ops := makeOps("storm", keys, o, wf, def)
	outs := make([][]outcome, keys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	ctx := context.Background()
	for k := range keys {
		outs[k] = make([]outcome, perKey*sends)
		for g := range perKey {
			wg.Go(func() {
				<-start
				for n := range sends {
					outs[k][g*sends+n] = cl.do(ctx, ops[k].request(), g+n)
				}
			})
		}
	}
	close(start)
	wg.Wait()

	for k, o := range ops {
		o.finish(outs[k][0])
		executed := 0
		var body []byte
		for _, out := range outs[k] {
			if !out.Definitive || out.Final.Status != 201 {
				res.fail(t, "key %s: a sender ended with %s", o.Key, lastOf(out))
				continue
			}
			if body == nil {
				body = out.Final.Body
			} else if !bytes.Equal(body, out.Final.Body) {
				res.fail(t, "key %s: two different 201 bodies: %s and %s", o.Key, clip(body), clip(out.Final.Body))
			}
			for _, a := range out.Attempts {
				if a.Status == 201 && !a.Replayed {
					executed++
				}
			}
		}
		if executed != 1 {
			res.fail(t, "key %s: %d requests executed (answered 201 without Idempotent-Replayed), want exactly 1", o.Key, executed)
		}
		// The same key with another body is a client bug: 422, not a replay.
		other := *o
		other.Variant = def.Variants[(k+1)%len(def.Variants)]
		if out := cl.do(ctx, other.request(), k); !out.Definitive || out.Final.Status != 422 || out.Final.code() != "idempotency_key_reused" {
			res.fail(t, "key %s reused with another body: %s, want 422 idempotency_key_reused", o.Key, lastOf(out))
		}
	}
	return ops
}

// apiReplicaKill: 160 starts by 8 clients over both replicas; once 50 are
// done, replica A gets `kill -9`. Its clients fail over to replica B with
// the same keys. Every operation ends with one 201 and one run; no 5xx.
func apiReplicaKill(t *testing.T, s *suite, res *result) {
	c, cl, rec, o := setup(t, s, "apikill")
	def := orderWorkflow()
	wf := createWorkflow(t, cl, o, def)
	ops := makeOps("apikill", 160, o, wf, def)
	l := startLoad(context.Background(), cl, ops, 8)
	if !waitUntil(2*time.Minute, func() bool { return l.done.Load() >= 50 }) {
		t.Fatalf("the load did not get going: %d operations done", l.done.Load())
	}
	faultAt := time.Now()
	c.servers[0].kill()
	doneAtKill := l.done.Load()
	l.wait()
	if doneAtKill >= int64(len(ops)) {
		res.fail(t, "the load ended before the kill: the scenario proved nothing")
	}
	t.Logf("replica A killed after %d of %d operations", doneAtKill, len(ops))
	verify(t, c, res, ops, expectations{faultAt: faultAt})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil) // a dead replica is a network error, never a 5xx
}

// postgresRestart: 160 starts by 8 clients; once 50 are done, PostgreSQL
// is stopped in immediate mode (every session dies, as in a crash) and kept
// down until the clients have had 20 answers from the replicas and cached
// tokens have expired, then started again. While it is down a start is 503 with Retry-After (a
// problem document), never a 500; afterwards everything completes.
func postgresRestart(t *testing.T, s *suite, res *result) {
	c, cl, rec, o := setup(t, s, "pgrestart")
	def := orderWorkflow()
	wf := createWorkflow(t, cl, o, def)
	ops := makeOps("pg", 160, o, wf, def)
	l := startLoad(context.Background(), cl, ops, 8)
	if !waitUntil(2*time.Minute, func() bool { return l.done.Load() >= 50 }) {
		t.Fatalf("the load did not get going: %d operations done", l.done.Load())
	}
	stopAt := time.Now()
	s.pg.stopImmediate()
	downAt := time.Now()
	// Down until the replicas answered 20 requests, and for longer than
	// AUTH_CACHE_TTL, so that authentication too must do without the database.
	authTTL := s.cfg.AuthCacheTTL + 500*time.Millisecond
	if !waitUntil(15*time.Second+authTTL, func() bool { return rec.answeredSince(downAt) >= 20 && time.Since(downAt) > authTTL }) {
		res.fail(t, "only %d requests were answered in 15 s while PostgreSQL was down: the replicas do not answer without it",
			rec.answeredSince(downAt))
	}
	upFrom := time.Now()
	s.pg.start()
	upAt := time.Now()
	t.Logf("PostgreSQL down for %s (restart took %s)", upAt.Sub(stopAt).Round(time.Millisecond), upAt.Sub(upFrom).Round(time.Millisecond))
	c.reconnect()
	l.wait()

	// The answers to starts while PostgreSQL was surely down.
	down, good := 0, 0
	var bad []string
	for _, op := range ops {
		for _, a := range op.Out.Attempts {
			if a.Status == 0 || a.At.Before(downAt) || a.At.After(upFrom) {
				continue
			}
			down++
			if a.Status == 503 && a.RetryAfter != "" && a.Problem {
				good++
			} else if len(bad) < 5 {
				bad = append(bad, fmt.Sprintf("%d %s (Retry-After %q)", a.Status, a.Code, a.RetryAfter))
			}
		}
	}
	t.Logf("starts answered while PostgreSQL was down: %d, of which 503 with Retry-After: %d", down, good)
	switch {
	case down == 0:
		res.fail(t, "no start was answered while PostgreSQL was down")
	case good != down:
		res.fail(t, "while PostgreSQL was down, %d of %d starts were not 503 with Retry-After, such as: %v", down-good, down, bad)
	}
	verify(t, c, res, ops, expectations{faultAt: stopAt})
	res.Requests = rec.requests.Load()
	// Expected: a 503 problem with Retry-After from the stop until 10 s
	// after PostgreSQL accepts connections again (pools find their dead
	// connections on use). Anything else, and any 500, is unexpected.
	windowEnd := upAt.Add(10 * time.Second)
	res.judge5xx(t, rec, func(e serverError) bool {
		return e.Status == 503 && e.RetryAfter != "" && e.Problem && !e.At.Before(stopAt) && !e.At.After(windowEnd)
	})
}

// redisRestart: slow runs are started until their tasks wait in Redis, then
// Redis is killed (no persistence: the queued and active tasks are gone)
// while 6 clients keep starting runs, and restarted. Starts never need
// Redis (no 5xx), and every accepted run must still become final.
func redisRestart(t *testing.T, s *suite, res *result) {
	c, cl, rec, o := setup(t, s, "redisrestart")
	slow, cheap := slowWorkflow(), orderWorkflow()
	slowID := createWorkflow(t, cl, o, slow)
	cheapID := createWorkflow(t, cl, o, cheap)
	// More slow starts at once than the workers' slots take, and enough of
	// them, so that some wait in Redis even when starts are slow (a loaded
	// machine under -race answered 24 starts from 4 clients no faster than
	// the workers executed them, and none ever waited).
	slowOps := makeOps("redis-slow", 48, o, slowID, slow)
	cheapOps := makeOps("redis", 120, o, cheapID, cheap)
	ctx := context.Background()

	ins := asynq.NewInspector(asynq.RedisClientOpt{Addr: s.redis.addr()})
	rc := s.redis.client()
	defer rc.Close()
	pending := func() int { return runsWaitingInRedis(ctx, ins, rc) }
	ls := startLoad(ctx, cl, slowOps, 8)
	if !waitUntil(time.Minute, func() bool { return pending() >= 4 }) {
		_ = ins.Close()
		t.Fatalf("no run ever waited in Redis, in the queue or at the gate (%d)", pending())
	}
	lc := startLoad(ctx, cl, cheapOps, 6)
	if !waitUntil(30*time.Second, func() bool { return lc.done.Load() >= 20 }) {
		_ = ins.Close()
		t.Fatalf("the load did not get going before the crash: %d operations done", lc.done.Load())
	}
	inRedis := pending()
	_ = ins.Close()
	faultAt := time.Now()
	s.redis.crash()
	doneAtCrash := lc.done.Load()
	// Down until 30 more starts were accepted (they only write PostgreSQL;
	// their runs wait there, queued, as the API cannot hand them off).
	if !waitUntil(20*time.Second, func() bool {
		return lc.done.Load() >= min(doneAtCrash+30, int64(len(cheapOps)))
	}) {
		res.fail(t, "while Redis was down for 20 s: %d starts done (want 30)", lc.done.Load()-doneAtCrash)
	}
	s.redis.start()
	t.Logf("Redis killed with %d run tasks pending in it, down for %s", inRedis, time.Since(faultAt).Round(time.Millisecond))
	ls.wait()
	lc.wait()
	verify(t, c, res, append(slowOps, cheapOps...), expectations{faultAt: faultAt})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)
}

// runsWaitingInRedis counts the runs waiting in Redis: their tasks in
// asynq's queue, or the runs waiting their organisation's turn at the gate
// (tasks/fair.go's payload hash). A Redis without persistence loses both,
// and a failover what the replica had not received.
func runsWaitingInRedis(ctx context.Context, ins *asynq.Inspector, rc *redis.Client) int {
	n := 0
	if qi, err := ins.GetQueueInfo("default"); err == nil { // else no queue yet
		n = qi.Pending
	}
	ready, _ := rc.LLen(ctx, "valruns:{default}:ready").Result()
	n += int(ready)
	waiting, _ := rc.HLen(ctx, "valruns:{fair}:payloads").Result()
	return n + int(waiting)
}

// workerKill: slow runs keep both workers busy; once more runs are running
// than one worker can hold (so the other surely holds some), worker A gets
// `kill -9`. Every run must be final within a minute of the kill, and every
// run A held at the kill (it logged "run claimed" and not its end) must be
// finished by another delivery: a later attempt, with the findings of an
// unpaused run.
func workerKill(t *testing.T, s *suite, res *result) {
	c, cl, rec, o := setup(t, s, "workerkill")
	slow := slowWorkflow()
	wf := createWorkflow(t, cl, o, slow)
	ops := makeOps("wkill", 120, o, wf, slow)
	l := startLoad(context.Background(), cl, ops, 6)
	held, faultAt, running := catchMidRun(t, c, s)
	c.workers[0].kill() // stopped: it dies holding what it held at the stop
	t.Logf("worker A killed with %d runs running (each worker runs %d at once), %d of them its own",
		running, s.cfg.WorkerConcurrency, len(held))
	l.wait()
	verify(t, c, res, ops, expectations{faultAt: faultAt, finalBy: faultAt.Add(finalWithin)})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)
	if len(held) == 0 {
		res.fail(t, "worker A held no run at the kill: the scenario proved nothing")
	}
	requireTakenOver(t, c, res, held, "killed", c.workers[0].log.String(), faultAt.Add(s.cfg.RunLease))
	requireTakeoverWithin(t, s, c, res, runIDs(held), c.workers[0], faultAt, "claimed")
}

// workerKillFast: worker A gets `kill -9` while it drains a backlog of
// runs it executes without a claim (the fast path, on as by default:
// validate, then one fenced write from queued to final, batched with other
// runs' writes). What A had taken then (its taking list) is neither
// claimed nor final: a sweep moves it back to the ready list once A has not
// beaten for RUN_LEASE. The runs are the slow workflow's (a
// tenth of a second to half a second each, under RUN_FAST_PATH), so that
// A's slots are busy: cheap runs travel many to a task and a backlog of
// them drains in milliseconds. A is stopped first (SIGSTOP); its tasks are
// those still active 7 s later whose lease nobody extended since the stop
// (a live worker's heartbeat extends its tasks' leases every 5 s, so none
// of B's, however slow B's runs are), and it is killed only when one of
// them held a run still queued at the stop (unclaimed: on the fast path;
// B's sweeper may deliver it again meanwhile, RUN_REDELIVER_AFTER); else it
// goes on and is caught again, up to 20 times, or the scenario proved
// nothing. Every run must be final within a minute of the kill, exactly once.
func workerKillFast(t *testing.T, s *suite, res *result) {
	// The fast path as it runs by default (the suite claims every run
	// first, RUN_FAST_PATH=0, so that the other scenarios catch held runs).
	c, cl, rec, o := setupWith(t, s, "wkillfast", unclaimedSettings)
	slow := slowWorkflow()
	wf := createWorkflow(t, cl, o, slow)
	ctx := context.Background()
	for _, w := range c.workers {
		w.signal(syscall.SIGSTOP)
		if !waitUntil(10*time.Second, w.isStopped) {
			t.Fatalf("%s did not stop", w.name)
		}
	}
	ops := makeOps("wkill-fast", 400, o, wf, slow)
	startLoad(ctx, cl, ops, 16).wait()
	ins := asynq.NewInspector(asynq.RedisClientOpt{Addr: s.redis.addr()})
	defer ins.Close()
	rc := s.redis.client()
	defer rc.Close()
	// A backlog in Redis for the workers to drain (the API hands runs off
	// after their 201, in the background).
	if !waitUntil(time.Minute, func() bool { return runsWaitingInRedis(ctx, ins, rc) >= len(ops)/2 }) {
		t.Fatalf("the backlog never reached Redis: %d runs waiting", runsWaitingInRedis(ctx, ins, rc))
	}
	for _, w := range c.workers {
		w.signal(syscall.SIGCONT)
	}
	a := c.workers[0]
	var held []string
	faultAt, _ := stopHolding(t, a, func() bool {
		n, err := c.count(`SELECT count(*) FROM validation_runs WHERE finished_at IS NULL`)
		return err == nil && n > 0
	}, func(try int) string {
		return fmt.Sprintf("the backlog drained before worker A could be caught (try %d)", try)
	}, func() bool {
		queued := func(run string) bool {
			n, err := c.count(`SELECT count(*) FROM validation_runs WHERE id = $1 AND status = 'queued'`, run)
			return err == nil && n == 1
		}
		// The runs A took from the ready list: read at once, as a sweep
		// takes them over once A has not beaten for RUN_LEASE.
		time.Sleep(time.Second)
		held = takenBy(t, rc, a.pid(), queued)
		return len(held) > 0
	})
	a.kill()
	t.Logf("worker A killed holding %d runs unclaimed at its stop, in its taking list", len(held))
	verify(t, c, res, ops, expectations{faultAt: faultAt, finalBy: faultAt.Add(finalWithin)})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)
	if len(held) == 0 {
		res.fail(t, "worker A held no unclaimed run at the kill: the scenario proved nothing")
	}
	requireTakeoverWithin(t, s, c, res, held, a, faultAt, "unclaimed")
}

// takenBy lists the runs in the taking list of the worker process pid
// (tasks/handoff.go: the ids in valruns:{default}:takers are host:pid:random,
// each with its list valruns:{default}:taking:<id>), of those that keep
// keeps.
func takenBy(t *testing.T, rc *redis.Client, pid int, keep func(run string) bool) []string {
	ctx := context.Background()
	ids, err := rc.SMembers(ctx, "valruns:{default}:takers").Result()
	if err != nil {
		t.Logf("the hand-off's takers: %v", err)
		return nil
	}
	var runs []string
	for _, id := range ids {
		if !strings.Contains(id, fmt.Sprintf(":%d:", pid)) {
			continue
		}
		items, err := rc.LRange(ctx, "valruns:{default}:taking:"+id, 0, -1).Result()
		if err != nil {
			t.Logf("the hand-off's runs taken: %v", err)
			continue
		}
		for _, raw := range items {
			var it struct {
				Run struct {
					RunID string `json:"run_id"`
				} `json:"run"`
			}
			if json.Unmarshal([]byte(raw), &it) == nil && it.Run.RunID != "" && keep(it.Run.RunID) {
				runs = append(runs, it.Run.RunID)
			}
		}
	}
	return runs
}

// stoppedWorkersTasks lists the runs of asynq's active tasks that belong to
// a worker stopped (or dead) by stopped, of those that keep kept then: the
// tasks still active 7 s later whose lease was not extended since (if no
// active task has a run to keep, it says so at once). asynq leases a task for 30 s when a worker
// takes it (the score in asynq:{default}:lease, in whole seconds), and the
// worker's heartbeat extends the leases of its tasks every 5 s: 7 s after
// stopped, a live worker's task has a lease past stopped+30 s, a stopped
// worker's task at most that.
func stoppedWorkersTasks(t *testing.T, ins *asynq.Inspector, rc *redis.Client, stopped time.Time, keep func(run string) bool) []string {
	active := func() map[string][]string {
		out := map[string][]string{}
		tasks, err := ins.ListActiveTasks("default", asynq.PageSize(1000))
		if err != nil {
			t.Logf("active tasks: %v", err)
			return out
		}
		for _, ti := range tasks {
			// A task of one run, or of runs handed off together.
			var p struct {
				RunID string `json:"run_id"`
				Runs  []struct {
					RunID string `json:"run_id"`
				} `json:"runs"`
			}
			_ = json.Unmarshal(ti.Payload, &p)
			runs := []string{p.RunID}
			for _, r := range p.Runs {
				runs = append(runs, r.RunID)
			}
			out[ti.ID] = runs
		}
		return out
	}
	first := active()
	for id, runs := range first {
		if runs = slices.DeleteFunc(runs, func(run string) bool { return run == "" || !keep(run) }); len(runs) > 0 {
			first[id] = runs
		} else {
			delete(first, id)
		}
	}
	if len(first) == 0 {
		return nil
	}
	time.Sleep(time.Until(stopped.Add(7 * time.Second)))
	var runs []string
	for id := range active() {
		lease, err := rc.ZScore(context.Background(), "asynq:{default}:lease", id).Result()
		if err != nil || lease > float64(stopped.Unix()+30) {
			continue // a live worker's (or no lease to read)
		}
		runs = append(runs, first[id]...)
	}
	return runs
}

// catchMidRun stops worker A (SIGSTOP) while more runs are running than
// one worker holds, and returns the runs it holds (its log says claimed,
// not ended, and they are still running as that attempt), when it was
// stopped, and how many runs were running. A run may take a tenth of a
// second on a fast machine, so A may have ended its runs by the time the
// signal lands: then it goes on (SIGCONT) and is caught again, up to 20
// times; A is left stopped. Its held runs are empty only if every try
// missed (the caller then fails: the scenario proved nothing).
func catchMidRun(t *testing.T, c *cluster, s *suite) (held map[string]int, stoppedAt time.Time, running int) {
	t.Helper()
	need := s.cfg.WorkerConcurrency + 1
	stoppedAt, try := stopHolding(t, c.workers[0], func() bool {
		running = len(runningRuns(c))
		return running >= need
	}, func(try int) string {
		return fmt.Sprintf("never saw %d runs running at once (saw %d, try %d): cannot catch a worker mid-run", need, running, try)
	}, func() bool {
		// Twice: a run whose last statement was on its way at the stop
		// ends meanwhile, and does not count as held (it proves nothing).
		held = stillHeld(c, stillHeld(c, heldRuns(c.workers[0].log.String())))
		return len(held) > 0
	})
	t.Logf("worker A caught holding %d runs at try %d", len(held), try)
	return held, stoppedAt, running
}

// stopHolding stops worker a (SIGSTOP) once ready holds (waiting up to a
// minute for it, else the test fails with notReady's words), and asks
// holds whether a, stopped, holds what the scenario needs to catch it
// with. If not, a goes on (SIGCONT) for a second and is caught again, up
// to 20 times: stopped again at once, a would never run, and once stopped
// longer than RUN_LEASE (a slow setup) it holds nothing, a sweep having
// taken over its runs until it beats again. It returns when a was last
// stopped, and the try; a is left stopped.
func stopHolding(t *testing.T, a *vproc, ready func() bool, notReady func(try int) string, holds func() bool) (stoppedAt time.Time, try int) {
	t.Helper()
	for try = 1; ; try++ {
		if !waitUntil(time.Minute, ready) {
			t.Fatal(notReady(try))
		}
		stoppedAt = time.Now()
		a.signal(syscall.SIGSTOP)
		if !waitUntil(10*time.Second, a.isStopped) {
			t.Fatalf("%s did not stop", a.name)
		}
		if holds() || try == 20 {
			return stoppedAt, try
		}
		a.signal(syscall.SIGCONT)
		time.Sleep(time.Second)
	}
}

// stillHeld keeps the runs of held (run id -> attempt) that are still
// running as that attempt: a line of the worker's log may not have been
// read yet when it stopped, so its log alone may list a run it has ended.
// Called once the worker is dead or stopped, before its lease can run out.
// It first gives PostgreSQL a moment to read what the worker sent just
// before the fault (such a statement ends a run while its lease is live).
func stillHeld(c *cluster, held map[string]int) map[string]int {
	time.Sleep(500 * time.Millisecond)
	out := map[string]int{}
	for id, attempt := range held {
		// A plain read, not one that skips locked rows: a row is locked by
		// any statement looking at it (a sweep, another worker's claim), and
		// a statement ending it that was on its way at the fault is told
		// apart later (requireTakenOver).
		if n, err := c.count(`SELECT count(*) FROM validation_runs WHERE id = $1 AND status = 'running' AND attempts = $2`,
			id, attempt); err == nil && n == 1 {
			out[id] = attempt
		}
	}
	return out
}

// heldRuns reads a worker's JSON log: the runs it claimed and had not
// ended (finished, ended in error, or lost) when its log stopped, with the
// attempt it held.
func heldRuns(log string) map[string]int {
	held := map[string]int{}
	for _, line := range strings.Split(log, "\n") {
		var e struct {
			Msg     string `json:"msg"`
			RunID   string `json:"run_id"`
			Attempt int    `json:"attempt"`
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.RunID == "" {
			continue
		}
		switch e.Msg {
		case "run claimed":
			held[e.RunID] = e.Attempt
		case "run finished", "run ended in error", "run was taken over by another delivery; result discarded",
			"lease lost while executing; execution stopped, the run is left to the delivery that holds it",
			"the worker lost the time of a validation; the run is retried":
			delete(held, e.RunID)
		}
	}
	return held
}

// runningRuns lists the ids of runs in status running.
func runningRuns(c *cluster) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.db.QueryContext(ctx, `SELECT id FROM validation_runs WHERE status = 'running'`)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if rows.Scan(&id) == nil {
			ids = append(ids, id)
		}
	}
	if errors.Is(rows.Err(), context.DeadlineExceeded) {
		return nil
	}
	return ids
}

// requireTakenOver fails res unless every run in held (run id -> the
// attempt a stopped or killed worker held) ended passed or failed by a
// later delivery. One exception, which is no stale write: the worker's
// last statement may have been on its way to PostgreSQL at the fault (sent,
// not yet read; a run ends in one statement), and PostgreSQL then runs it
// while the lease is still live. silentUntil is until when the worker could
// send nothing (its SIGCONT; for a kill, when its lease could first run
// out): a run the held attempt ended before then was ended by such a
// statement, is logged, and is not counted as taken over. The worker's own
// log (log) must not say it ended a held run after silentUntil either: a
// run's attempts count claims, so a stale delivery ending a run another
// delivery had claimed would otherwise pass as taken over. At least one run
// must have been taken over, or the scenario proved nothing.
func requireTakenOver(t *testing.T, c *cluster, res *result, held map[string]int, who, log string, silentUntil time.Time) {
	ended := endedAfter(log, silentUntil)
	taken := 0
	for id, attempt := range held {
		if at, ok := ended[id]; ok {
			res.fail(t, "run %s held by the %s worker as attempt %d: that stale delivery ended it at %s, after the worker could send again",
				id, who, attempt, at.Format(time.RFC3339Nano))
			continue
		}
		var status string
		var attempts int64
		var finished sql.NullTime
		err := c.db.QueryRow(`SELECT status, attempts, finished_at FROM validation_runs WHERE id = $1`, id).Scan(&status, &attempts, &finished)
		switch {
		case err != nil:
			res.fail(t, "run %s held by the %s worker: %v", id, who, err)
		case status != "passed" && status != "failed":
			res.fail(t, "run %s held by the %s worker (attempt %d) ended %s", id, who, attempt, status)
		case attempts > int64(attempt):
			taken++
		case finished.Valid && finished.Time.Before(silentUntil):
			t.Logf("run %s: attempt %d's last statement was on its way at the fault and ended it at %s, while its lease was live",
				id, attempt, finished.Time.Format(time.RFC3339Nano))
		default:
			res.fail(t, "run %s held by the %s worker as attempt %d was finished by that stale delivery at %s, after the worker could send again (%s)",
				id, who, attempt, finished.Time.Format(time.RFC3339Nano), silentUntil.Format(time.RFC3339Nano))
		}
	}
	if len(held) > 0 && taken == 0 {
		res.fail(t, "no run the %s worker held was taken over by another delivery: the scenario proved nothing", who)
	}
}

// endedAfter reads a worker's JSON log: the runs it says it ended (finished
// or ended in error) at or after from, with the time it logged it.
func endedAfter(log string, from time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	for _, line := range strings.Split(log, "\n") {
		var e struct {
			Time  time.Time `json:"time"`
			Msg   string    `json:"msg"`
			RunID string    `json:"run_id"`
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.RunID == "" || e.Time.Before(from) {
			continue
		}
		if e.Msg == "run finished" || e.Msg == "run ended in error" {
			out[e.RunID] = e.Time
		}
	}
	return out
}

// workerPause: slow runs keep both workers busy; worker A gets SIGSTOP
// (a paused VM, a long GC) for a second more than RUN_LEASE and the
// validation's time limits, then SIGCONT: soon enough that some of its runs
// may not have been claimed again yet. Its deliveries lost their leases:
// they write nothing, another delivery takes their runs over, and every run
// ends as an unpaused run does: no run in error, findings written once.
func workerPause(t *testing.T, s *suite, res *result) {
	c, cl, rec, o := setup(t, s, "workerpause")
	slow := slowWorkflow()
	wf := createWorkflow(t, cl, o, slow)
	ops := makeOps("wpause", 120, o, wf, slow)
	l := startLoad(context.Background(), cl, ops, 6)
	held, faultAt, _ := catchMidRun(t, c, s)
	time.Sleep(max(s.cfg.RunLease, validate.SchemaTimeout, validate.EvalTimeout) + time.Second)
	resumedAt := time.Now()
	c.workers[0].signal(syscall.SIGCONT)
	t.Logf("worker A stopped for %s holding %d runs", time.Since(faultAt).Round(time.Millisecond), len(held))
	l.wait()
	verify(t, c, res, ops, expectations{faultAt: faultAt, finalBy: time.Now().Add(finalWithin)})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)
	if len(held) == 0 {
		res.fail(t, "worker A held no run at the stop: the scenario proved nothing")
	}
	requireTakenOver(t, c, res, held, "stopped", c.workers[0].log.String(), resumedAt)
	requireTakeoverWithin(t, s, c, res, runIDs(held), c.workers[0], faultAt, "claimed")
}

// workerStarved: busy loops, two per core, beside the cluster while slow
// runs execute: the workers get a fraction of the CPU they need, and no
// valid run may end in error (the time limits count a validation's CPU
// time, not the wall clock).
func workerStarved(t *testing.T, s *suite, res *result) {
	c, cl, rec, o := setup(t, s, "workerstarved")
	slow := slowWorkflow()
	wf := createWorkflow(t, cl, o, slow)
	ops := makeOps("wstarved", 24, o, wf, slow)
	var stop atomic.Bool
	var hogs sync.WaitGroup
	for range 2 * runtime.NumCPU() {
		// Not locked to a thread: a goroutine that ends locked ends its
		// thread, and a child started from that thread (the suite's Redis,
		// restarted by redis_restart) gets its Pdeathsig.
		hogs.Go(func() {
			for !stop.Load() {
			}
		})
	}
	faultAt := time.Now()
	l := startLoad(context.Background(), cl, ops, 6)
	l.wait()
	stop.Store(true)
	hogs.Wait()
	t.Logf("%d runs started beside %d busy loops in %s", len(ops), 2*runtime.NumCPU(), time.Since(faultAt).Round(time.Millisecond))
	verify(t, c, res, ops, expectations{faultAt: faultAt})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)
}
