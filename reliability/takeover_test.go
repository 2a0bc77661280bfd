package reliability

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/internal/workload"
)

// The takeover bound: every run a dead or stopped worker held, claimed or
// not, is handed to another delivery (re-enqueued by a sweeper) within it
// of the fault. A claimed run's lease runs out at most RUN_LEASE after its
// worker's last heartbeat, and the next sweep, at most RUN_SWEEP_INTERVAL
// later, re-enqueues it; a run held unclaimed is re-enqueued once the
// worker's hold on its task has not been renewed for RUN_LEASE, which asynq
// records in whole seconds: one second more. And one second for a loaded
// machine.
func takeoverBound(s *suite) time.Duration {
	return s.cfg.RunLease + s.cfg.RunSweepInterval + 2*time.Second
}

// unclaimedSettings are the settings of the scenarios that catch a worker
// holding runs it has not claimed: the fast path on, as by default, and
// RUN_REDELIVER_AFTER four times RUN_LEASE, so that the takeover cannot
// rest on the sweeper's pass of the queued runs (once per
// RUN_REDELIVER_AFTER, which sees a task active twice, RUN_REDELIVER_AFTER
// apart, before it re-enqueues its run), only on the lease.
func unclaimedSettings(*cluster) []string {
	return []string{"RUN_FAST_PATH=1s", "RUN_REDELIVER_AFTER=20s"}
}

// heldWorkflow is slowWorkflow with eight times its scans over three
// times its items: about a third of a second a run on a fast machine
// (slowWorkflow's take 15 ms there), under workerPauseFast's RUN_FAST_PATH
// of 2 s on a slow one. A worker's slots are then busy with runs it
// validates without a claim for long enough that its asynq heartbeat,
// every 5 s, lists them.
func heldWorkflow() *workflowDef {
	def := slowWorkflow()
	def.Name = "inventory-held"
	def.Assertions = append(workload.Scans(8*workload.SlowChecks), def.expectFrom.Assertions...)
	def.Variants[0].Submission = workload.Items(3 * workload.SlowItems) // its light twin's too
	return def
}

// workerPauseFast: the fast path on for up to 2 s a run (RUN_FAST_PATH and
// RUN_HEARTBEAT 2 s; RUN_REDELIVER_AFTER 20 s: unclaimedSettings); 200 runs
// of heldWorkflow from 16 clients, validated straight from the queue
// without a claim. Worker A is stopped (SIGSTOP)
// just after its heartbeat listed the tasks it holds (heldUnclaimed), and
// kept stopped until it holds a run still queued, one it had not claimed
// (else it goes on and is caught again, up to 20 times). It stays stopped
// for the takeover bound and 3 s more, then goes on. Every run it held must
// have been re-enqueued for another delivery within the bound of the stop
// (requireTakeoverWithin) while A was stopped, and every run ends once:
// A's late writes find their runs no longer queued and write nothing.
func workerPauseFast(t *testing.T, s *suite, res *result) {
	c, cl, rec, o := setupWith(t, s, "wpausefast", func(c *cluster) []string {
		return append(unclaimedSettings(c), "RUN_HEARTBEAT=2s", "RUN_FAST_PATH=2s")
	})
	slow := heldWorkflow()
	wf := createWorkflow(t, cl, o, slow)
	ops := makeOps("wpause-fast", 200, o, wf, slow)
	l := startLoad(context.Background(), cl, ops, 16)
	ins := asynq.NewInspector(asynq.RedisClientOpt{Addr: s.redis.addr()})
	defer ins.Close()
	rc := s.redis.client()
	defer rc.Close()
	a := c.workers[0]
	held, faultAt := heldUnclaimed(t, c, ins, rc, a)
	t.Logf("worker A stopped holding %d runs it had not claimed", len(held))
	if len(held) == 0 {
		res.fail(t, "worker A held no unclaimed run at the stop: the scenario proved nothing")
	}
	time.Sleep(time.Until(faultAt.Add(takeoverBound(s) + 3*time.Second)))
	// Read while A is still stopped: taken over by another delivery, not
	// ended by A once it goes on.
	requireTakeoverWithin(t, s, c, res, held, a, faultAt, "unclaimed")
	a.signal(syscall.SIGCONT)
	l.wait()
	verify(t, c, res, ops, expectations{faultAt: faultAt, finalBy: time.Now().Add(finalWithin)})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)
}

// heldUnclaimed stops worker a (SIGSTOP) holding runs it has not claimed,
// and returns them and when it was stopped. A worker's asynq heartbeat
// lists the tasks it holds every 5 s (Inspector.Servers); a is stopped as
// soon as its listing changes, so the listing is a few milliseconds old.
// Its runs are those of the listed tasks that asynq still has active and
// that are still queued a second later: a's, since a task stays active in
// the worker that took it, and a live worker claims or ends a run it took
// within RUN_FAST_PATH. If a holds none, it goes on and is caught again,
// up to 20 times; a is left stopped.
func heldUnclaimed(t *testing.T, c *cluster, ins *asynq.Inspector, rc *redis.Client, a *vproc) (held []string, stoppedAt time.Time) {
	t.Helper()
	var seen string // what the last listing read, for the failure message
	listing := func() map[string][]string {
		out := map[string][]string{}
		servers, err := ins.Servers()
		if err != nil {
			seen = err.Error()
			return out
		}
		seen = fmt.Sprintf("%d servers:", len(servers))
		for _, srv := range servers {
			seen += fmt.Sprintf(" pid %d (%d tasks)", srv.PID, len(srv.ActiveWorkers))
			if srv.PID != a.pid() {
				continue
			}
			for _, w := range srv.ActiveWorkers {
				if w.Queue == "default" {
					out[w.TaskID] = taskRuns(w.TaskPayload)
				}
			}
		}
		return out
	}
	queued := func(run string) bool {
		n, err := c.count(`SELECT count(*) FROM validation_runs WHERE id = $1 AND status = 'queued'`, run)
		return err == nil && n == 1
	}
	var last, listed map[string][]string
	stoppedAt, _ = stopHolding(t, a, func() bool {
		if len(takenBy(t, rc, a.pid(), func(string) bool { return true })) > 0 {
			return true // it holds runs it took from the ready list
		}
		now := listing()
		changed := last != nil && len(now) > 0 && !sameKeys(now, last)
		last = now
		listed = now
		return changed
	}, func(try int) string {
		return fmt.Sprintf("worker A (pid %d) never listed a new task in a heartbeat nor took a run from the ready list (try %d; the last read: %s)", a.pid(), try, seen)
	}, func() bool {
		last = nil // the next try waits for a listing newer than this stop
		time.Sleep(time.Second)
		// The runs A took from the ready list and has not ended (its
		// list cannot change while it is stopped), then its tasks'.
		held = takenBy(t, rc, a.pid(), queued)
		for id, runs := range listed {
			if ti, err := ins.GetTaskInfo("default", id); err != nil || ti.State != asynq.TaskStateActive {
				continue
			}
			for _, run := range runs {
				if queued(run) {
					held = append(held, run)
				}
			}
		}
		return len(held) > 0
	})
	return held, stoppedAt
}

// taskRuns returns the runs a run task's payload carries: one, or a batch.
func taskRuns(payload []byte) []string {
	var p struct {
		RunID string `json:"run_id"`
		Runs  []struct {
			RunID string `json:"run_id"`
		} `json:"runs"`
	}
	_ = json.Unmarshal(payload, &p)
	var runs []string
	if p.RunID != "" {
		runs = append(runs, p.RunID)
	}
	for _, r := range p.Runs {
		if r.RunID != "" {
			runs = append(runs, r.RunID)
		}
	}
	return runs
}

func sameKeys(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

// requireTakeoverWithin fails res unless every run in runs, held by the
// stopped or killed worker holder at faultAt, was re-enqueued for another
// delivery by a sweeper (the log line "stranded run re-enqueued" of
// another worker) within takeoverBound of faultAt. A run ended within the
// bound without one was not held (nothing else can end a held run while
// its holder is stopped or dead): it is logged and left out; one run at
// least must have been taken over. The takeover times, and
// when another delivery claimed each run, are reported as figures. what
// says which runs they are (claimed, unclaimed).
func requireTakeoverWithin(t *testing.T, s *suite, c *cluster, res *result, runs []string, holder *vproc, faultAt time.Time, what string) {
	t.Helper()
	bound := takeoverBound(s)
	redelivered, claimed := map[string]time.Time{}, map[string]time.Time{}
	for _, w := range c.workers {
		if w == holder {
			continue
		}
		for _, line := range strings.Split(w.log.String(), "\n") {
			var e struct {
				Time  time.Time `json:"time"`
				Msg   string    `json:"msg"`
				RunID string    `json:"run_id"`
			}
			if json.Unmarshal([]byte(line), &e) != nil || e.RunID == "" || e.Time.Before(faultAt) {
				continue
			}
			var m map[string]time.Time
			switch e.Msg {
			case "stranded run re-enqueued":
				m = redelivered
			case "run claimed":
				m = claimed
			default:
				continue
			}
			if at, ok := m[e.RunID]; !ok || e.Time.Before(at) {
				m[e.RunID] = e.Time
			}
		}
	}
	var took []time.Duration
	notTaken := 0
	for _, id := range runs {
		at, ok := redelivered[id]
		var finished sql.NullTime
		if !ok && c.db.QueryRow(`SELECT finished_at FROM validation_runs WHERE id = $1`, id).Scan(&finished) == nil &&
			finished.Valid && finished.Time.Before(faultAt.Add(bound)) {
			// Ended within the bound with no takeover, while its holder
			// could not write: not held after all. A statement of the
			// holder's was on its way at the fault and ended it (see
			// requireTakenOver), or the run was another worker's.
			t.Logf("run %s (%s): ended at %s, %s after the fault, without a takeover: not held", id, what,
				finished.Time.Format(time.RFC3339Nano), finished.Time.Sub(faultAt).Round(time.Millisecond))
			continue
		}
		switch {
		case !ok:
			notTaken++
			res.fail(t, "run %s, held %s by worker A at the fault: not taken over by another delivery (bound %s)", id, what, bound)
			continue
		case at.Sub(faultAt) > bound:
			res.fail(t, "run %s, held %s by worker A at the fault: taken over after %s, past the bound of %s",
				id, what, at.Sub(faultAt).Round(time.Millisecond), bound)
		}
		took = append(took, at.Sub(faultAt))
		if cl, ok := claimed[id]; ok {
			t.Logf("run %s (%s): re-enqueued %s after the fault, claimed by another delivery %s after it", id, what,
				at.Sub(faultAt).Round(time.Millisecond), cl.Sub(faultAt).Round(time.Millisecond))
		}
	}
	if len(runs) > 0 && len(took) == 0 && notTaken == 0 {
		res.fail(t, "no %s run held by worker A at the fault was taken over: the scenario proved nothing", what)
	}
	if len(took) > 0 {
		slices.Sort(took)
		res.figure("%d %s runs taken over in %s to %s of the fault (bound %s)", len(took), what,
			took[0].Round(100*time.Millisecond), took[len(took)-1].Round(100*time.Millisecond), bound)
	}
}

// runIDs returns the runs of held (run id -> attempt).
func runIDs(held map[string]int) []string {
	var ids []string
	for id := range held {
		ids = append(ids, id)
	}
	return ids
}
