package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/models"
)

// Sweeper keeps every accepted run re-deliverable until it is final. The
// API hands a run to Redis after its start commits, and from then on Redis
// alone remembers it: a hand-off that failed (Redis down, the API process
// killed), a restart without persistence or a failover loses it, and a
// worker that dies mid-run leaves its run running. PostgreSQL knows better:
// every interval the sweeper lists the runs that are not final and that
// nothing seems to be delivering, and enqueues a new task for each:
//
//   - running runs whose lease ran out (their worker died or stopped);
//   - queued runs whose task a worker has held for longer than lease
//     without claiming them (stoppedHolders): it died or stopped with them
//     (a SIGSTOP, a paused VM). So every run a worker held, claimed or
//     not, is taken over within lease and a sweep of its worker stopping;
//   - queued runs older than after whose latest task is not in Redis, read
//     straight from asynq's task hashes, a page at a time in one pipelined
//     round trip. A task that is pending, scheduled or retrying is left
//     alone, and so is an active one, unless it has been active for longer
//     than after: its worker died with it (asynq would give it back only
//     when its own lease of it runs out, a minute or more later). The
//     queued runs are paged through at most once per after, so a backlog
//     costs a read per run every after, not every interval.
//
// Each redelivery has the TaskID validation_run:<id>:redeliver:<n>, n
// counted in the run's row (MarkRedelivered): a new ID each time, the same
// ID for every sweeper that redelivers the same run at the same moment
// (asynq refuses the duplicates). Executing a run twice is prevented by the
// claim's attempt fencing, not by TaskIDs: a redundant delivery finds the
// run finished or held, and does nothing.
type Sweeper struct {
	runs  *models.RunStore
	redis redis.UniversalClient
	// queue admits the runs it re-enqueues through the gate, and enqueues
	// them.
	queue queueWriter
	// release lets an organisation's waiting runs in, as far as its share
	// allows (the worker's): each sweep does, for every organisation with
	// runs waiting, in case the releases of its runs did not reach Redis.
	release func(ctx context.Context, org string, ids []string, cost time.Duration)
	// interval between sweeps; after is how old a queued run must be
	// before it is looked at, and how often the queued runs are paged.
	interval, after time.Duration
	// lease is RUN_LEASE: a worker that holds a queued run's task without
	// claiming it for longer has stopped (stoppedHolders).
	lease time.Duration
	// taskInfo reads a task of the default queue (the runs of a batch task).
	taskInfo func(queue, id string) (*asynq.TaskInfo, error)
	batch    int
	log      *slog.Logger
	m        *metrics

	// the queued runs' pass: where it is, and when the last one began.
	cursor     *models.RunCursor
	passBegan  time.Time
	passActive bool
	// directListed holds, for the sweep under way, the runs the direct
	// hand-off's lists hold: the shared one, and those of the workers
	// alive (listedDirect). Such a run is on its way, not lost.
	directListed map[string]bool
	// activeSince is when a sweep first saw a queued run's task active: a
	// task still active after longer than after is one whose worker died
	// with it (asynq gives it back only when its own lease of it runs out,
	// a minute or more later), and the run is re-enqueued.
	activeSince map[string]time.Time
}

// Run sweeps every interval until ctx is done.
func (s *Sweeper) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.m.sweeps.WithLabelValues("error").Inc()
			s.log.WarnContext(ctx, "sweep for stranded runs failed; will retry", "error", err, "retry_in", s.interval)
			continue
		}
		s.m.sweeps.WithLabelValues("ok").Inc()
	}
}

// Sweep re-enqueues the running runs whose lease ran out and, at most
// once per after, every queued run older than after whose task is gone; it
// returns how many it re-enqueued.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	n := 0
	if s.release != nil {
		orgs, err := s.queue.gate.waitingOrgs(ctx)
		if err != nil {
			return n, err
		}
		for _, org := range orgs {
			// Admitted runs that ended (or are unknown) leave the gate: their
			// release may never have reached Redis (a failover promoted a
			// replica that had not seen it), and they would hold their
			// organisation's places until RUN_TIMEOUT, its waiting runs
			// stranded behind them.
			ended, err := s.endedAdmitted(ctx, org)
			if err != nil {
				return n, err
			}
			s.release(ctx, org, ended, 0)
		}
	}
	stopped, held, err := s.stoppedHolders(ctx)
	if err != nil {
		return n, err
	}
	taken, err := s.stoppedTakers(ctx)
	if err != nil {
		return n, err
	}
	held = append(held, taken...)
	if s.directListed, err = s.listedDirect(ctx); err != nil {
		return n, err
	}
	// Not again while another task of the run waits in the queue, or is
	// active in a worker that still renews its hold on it.
	rs, err := s.lost(ctx, held, true, stopped)
	if err != nil {
		return n, err
	}
	for _, r := range rs {
		ok, err := s.redeliver(ctx, r, "held_unclaimed")
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	for {
		all, err := s.runs.StrandedRunning(ctx, s.batch)
		if err != nil {
			return n, err
		}
		// Not again while its last redelivery waits in the queue; an active
		// task counts as gone: its worker may have died with it.
		rs, err := s.lost(ctx, all, false, nil)
		if err != nil {
			return n, err
		}
		for _, r := range rs {
			ok, err := s.redeliver(ctx, r, "lease_expired")
			if err != nil {
				return n, err
			}
			if ok {
				n++
			}
		}
		if len(all) < s.batch {
			break
		}
	}
	if !s.passActive && time.Since(s.passBegan) < s.after {
		return n, nil
	}
	if !s.passActive {
		s.passActive, s.passBegan, s.cursor = true, time.Now(), nil
	}
	for {
		rs, next, err := s.runs.QueuedSince(ctx, s.after, s.cursor, s.batch)
		if err != nil {
			return n, err
		}
		lost, err := s.lost(ctx, rs, true, stopped)
		if err != nil {
			return n, err
		}
		for _, r := range lost {
			ok, err := s.redeliver(ctx, r, "queued")
			if err != nil {
				return n, err
			}
			if ok {
				n++
			}
		}
		s.cursor = next
		if next == nil {
			s.passActive = false
			return n, nil
		}
	}
}

// endedAdmitted returns the runs of org the gate counts as admitted that
// are neither queued nor running in PostgreSQL.
func (s *Sweeper) endedAdmitted(ctx context.Context, org string) ([]string, error) {
	ids, err := s.queue.gate.admitted(ctx, org)
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	return s.runs.NotPending(ctx, ids)
}

// taskKey is where asynq keeps a task of the default queue: a hash whose
// field "state" says pending, active, scheduled, retry, archived or
// completed (TestSweepersRedeliverEachLostRunOnce and
// TestSweepersRedeliverALostBatchOnce pin it to the asynq in go.mod: a
// waiting task read as gone would be re-enqueued, and they count that).
func taskKey(taskID string) string { return "asynq:{" + queue + "}:t:" + taskID }

// leaseKey is asynq's lease set of the default queue: the ID of every
// active task, scored by when its worker's hold on it runs out, in whole
// Unix seconds. A worker's heartbeater renews the holds of all its tasks
// every 5 s, each to asynqLease from then; a worker that died or stopped
// renews nothing (TestSweeperTakesOverAStoppedWorkersUnclaimedRun pins
// both to the asynq in go.mod).
func leaseKey() string { return "asynq:{" + queue + "}:lease" }

// asynqLease is how long from its last renewal asynq's hold of an active
// task lasts (its LeaseDuration); asynq itself gives the task back only
// 30 s after that, at its recoverer's next pass (each minute).
const asynqLease = 30 * time.Second

// stoppedHolders finds the runs that a worker which stopped holds without
// having claimed them: the tasks whose hold was last renewed more than
// lease ago (a hold of score t was renewed before t - asynqLease + 1 s),
// and of their runs those still queued. A live worker renews its holds
// every 5 s and claims or ends a queued run within RUN_FAST_PATH (at most
// RUN_HEARTBEAT), so a queued run held that long is one its worker died or
// stopped with. stopped is the set of those tasks' IDs. One read of the
// lease set per sweep; a task's payload and a statement only for tasks
// held that long (mostly none).
func (s *Sweeper) stoppedHolders(ctx context.Context) (stopped map[string]bool, held []models.StrandedRun, err error) {
	if s.lease <= 0 || s.taskInfo == nil {
		return nil, nil, nil
	}
	cutoff := time.Now().Add(asynqLease - time.Second - s.lease).Unix()
	ids, err := s.redis.ZRangeByScore(ctx, leaseKey(), &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(cutoff, 10)}).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("read task holds: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil, nil
	}
	stopped = map[string]bool{}
	var runIDs []string
	for _, id := range ids {
		ti, err := s.taskInfo(queue, id)
		if err != nil || (ti.Type != TypeRunExecute && ti.Type != TypeRunBatch) {
			continue // gone meanwhile, or not a run's
		}
		stopped[id] = true
		var p struct {
			RunID string       `json:"run_id"`
			Runs  []RunPayload `json:"runs"`
		}
		if json.Unmarshal(ti.Payload, &p) != nil {
			continue
		}
		if p.RunID != "" {
			runIDs = append(runIDs, p.RunID)
		}
		for _, r := range p.Runs {
			if r.RunID != "" {
				runIDs = append(runIDs, r.RunID)
			}
		}
	}
	if len(runIDs) == 0 {
		return stopped, nil, nil
	}
	held, err = s.runs.QueuedOf(ctx, runIDs)
	return stopped, held, err
}

// stoppedTakers finds the runs that a worker which stopped took from the
// direct hand-off (its list of runs taken) and had not finished: the
// workers that did not beat for lease leave directTakers, their lists are
// deleted, and of the runs those held the ones still queued are returned.
// A live worker beats every second and finishes or hands on a run it took
// within RUN_FAST_PATH, so a queued run it held that long is one it died or
// stopped with. One script per sweep; a statement only when a worker
// stopped.
func (s *Sweeper) stoppedTakers(ctx context.Context) ([]models.StrandedRun, error) {
	if s.lease <= 0 {
		return nil, nil
	}
	items, err := directExpiredScript.Run(ctx, s.redis, []string{directTakers}, directTaking, s.lease.Milliseconds()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("read the direct hand-off's stopped workers: %w", err)
	}
	ids := directRunIDs(items)
	if len(ids) == 0 {
		return nil, nil
	}
	return s.runs.QueuedOf(ctx, ids)
}

// listedDirect is the set of runs the direct hand-off's lists hold: the
// shared one, and those of the workers that beat within lease.
func (s *Sweeper) listedDirect(ctx context.Context) (map[string]bool, error) {
	items, err := directListedScript.Run(ctx, s.redis, []string{directTakers, directRuns}, directTaking, s.lease.Milliseconds()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("read the direct hand-off's lists: %w", err)
	}
	set := map[string]bool{}
	for _, id := range directRunIDs(items) {
		set[id] = true
	}
	return set, nil
}

// lost returns the runs of rs none of whose tasks Redis holds as pending,
// scheduled, retrying or (with active) active: its latest single task, and
// the batch task that carries it (batchIndexKey), if any; and that do not
// wait their turn at the gate. A task in stopped is held by a worker that
// stopped: it counts as gone. Two pipelined round trips.
func (s *Sweeper) lost(ctx context.Context, rs []models.StrandedRun, active bool, stopped map[string]bool) ([]models.StrandedRun, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	states := make([]*redis.StringCmd, len(rs))
	batches := make([]*redis.StringCmd, len(rs))
	waits := make([]*redis.BoolCmd, len(rs))
	_, err := s.redis.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range rs {
			states[i] = p.HGet(ctx, taskKey(runTaskID(r.ID, r.Redeliveries)), "state")
			batches[i] = p.HGet(ctx, batchIndexKey, r.ID)
			waits[i] = p.HExists(ctx, fairPayloads, r.ID)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read task states: %w", err)
	}
	batchStates := make([]*redis.StringCmd, len(rs))
	_, err = s.redis.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range batches {
			if id, err := c.Result(); err == nil {
				batchStates[i] = p.HGet(ctx, taskKey(id), "state")
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read batch task states: %w", err)
	}
	var out []models.StrandedRun
	now := time.Now()
	if s.activeSince == nil {
		s.activeSince = map[string]time.Time{}
	}
	for i := range rs {
		alive, err := waiting(states[i], false)
		if err == nil && !alive && batchStates[i] != nil {
			alive, err = waiting(batchStates[i], false)
		}
		if err != nil {
			return nil, err
		}
		if !alive && waits[i].Val() {
			alive = true // its organisation's turn will come
		}
		if !alive && s.directListed[rs[i].ID] {
			alive = true // in the direct hand-off: waiting, or taken by a worker alive
		}
		// Active in a worker that still renews its hold (not in stopped):
		// alive, unless it has been for longer than after.
		single := isActive(states[i]) && !stopped[runTaskID(rs[i].ID, rs[i].Redeliveries)]
		batch := batchStates[i] != nil && isActive(batchStates[i]) && !stopped[batches[i].Val()]
		if !alive && active && (single || batch) {
			first, seen := s.activeSince[rs[i].ID]
			if !seen {
				s.activeSince[rs[i].ID] = now
			}
			alive = !seen || now.Sub(first) < s.after
		}
		if !alive {
			delete(s.activeSince, rs[i].ID)
			out = append(out, rs[i])
		}
	}
	for id, first := range s.activeSince { // runs that went on: forget them
		if now.Sub(first) > 10*s.after {
			delete(s.activeSince, id)
		}
	}
	return out, nil
}

// isActive reports whether a task's state read says active.
func isActive(c *redis.StringCmd) bool { st, err := c.Result(); return err == nil && st == "active" }

// waiting reads a task's state: whether Redis holds it as pending,
// scheduled, retrying or (with active) active (archived, completed or gone:
// nothing will deliver it again).
func waiting(c *redis.StringCmd, active bool) (bool, error) {
	switch st, err := c.Result(); {
	case errors.Is(err, redis.Nil):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read task state: %w", err)
	default:
		return st == "pending" || st == "scheduled" || st == "retry" || active && st == "active", nil
	}
}

// redeliver enqueues a new task for r, through the gate (it may wait its
// organisation's turn), and counts it; false when another sweeper counted
// it first, or its row is busy (its delivery is writing it: the count waits
// for a later sweep, which finds the same task ID already sent). Counting
// never waits on a run its own redelivery is writing.
func (s *Sweeper) redeliver(ctx context.Context, r models.StrandedRun, reason string) (bool, error) {
	p := RunPayload{RunID: r.ID, OrgID: r.OrgID, Redelivery: true, Redeliveries: r.Redeliveries + 1, CreatedAt: r.CreatedAt}
	// A conflict at the enqueue counts as sent: another sweeper sent it.
	if err := s.queue.send(ctx, admission{org: r.OrgID, recorded: true, in: []RunPayload{p}}); err != nil {
		return false, fmt.Errorf("redeliver run %s: %w", r.ID, err)
	}
	// Its batch, if it had one, is gone: forget it (the redelivery is a task of its own).
	_ = s.redis.HDel(ctx, batchIndexKey, r.ID).Err()
	counted, err := s.runs.MarkRedelivered(ctx, r)
	if err != nil || !counted {
		return false, err
	}
	s.m.redelivered.WithLabelValues(reason).Inc()
	s.log.InfoContext(ctx, "stranded run re-enqueued", "run_id", r.ID, "status", r.Status,
		"reason", reason, "redelivery", r.Redeliveries+1)
	return true, nil
}

// queue is the asynq queue every task of valruns goes to.
const queue = "default"

// runTaskID is the TaskID of a run's n-th redelivery; the 0th is the
// API's hand-off.
func runTaskID(runID string, n int) string {
	if n == 0 {
		return models.RunTaskIDPrefix + runID
	}
	return fmt.Sprintf("%s%s:redeliver:%d", models.RunTaskIDPrefix, runID, n)
}
