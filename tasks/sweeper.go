package tasks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/models"
)

// Sweeper keeps every accepted run re-deliverable until it is final. The
// API hands a run to Redis after its start commits, and from then on Redis
// alone remembers it: a hand-off that failed (Redis down, the API process
// killed), a restart without persistence or a failover loses it, and a
// worker that dies mid-run leaves its run running. PostgreSQL knows better.
// Every interval the sweeper:
//
//   - lets in the runs waiting at the gate that their organisation's share
//     allows (a release that never reached Redis, a queue resumed);
//   - moves the taking list of every taker whose alive key ran out (it
//     died or stopped) back to ready, where a live worker takes its runs;
//   - hands on the running runs whose lease ran out, and, at most once per
//     after, the queued runs older than after, that nothing holds: not in
//     ready nor in a taking list, not waiting at the gate, and with no
//     retry pending in asynq.
//
// A run is handed on by counting its redelivery in its row first
// (MarkRedelivered, which one sweeper wins), then pushing it through the
// gate: several sweepers never push one run twice for one sweep. Executing
// a run twice is prevented by the claim's attempt fencing anyway: a
// redundant delivery finds the run finished or held, and does nothing.
type Sweeper struct {
	runs  *models.RunStore
	redis redis.UniversalClient
	// queue pushes the runs it hands on through the gate.
	queue queueWriter
	// release lets an organisation's waiting runs in, as far as its share
	// allows (the worker's).
	release func(ctx context.Context, org string, ids []string, cost time.Duration)
	// interval between sweeps; after is how old a queued run must be
	// before it is looked at, and how often the queued runs are paged.
	interval, after time.Duration
	batch           int
	log             *slog.Logger
	m               *metrics

	// the queued runs' pass: where it is, and when the last one began.
	cursor     *models.RunCursor
	passBegan  time.Time
	passActive bool
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

// Sweep does one sweep; it returns how many runs it handed on.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	waiting, err := s.takeOver(ctx)
	if err != nil {
		return 0, err
	}
	if err := s.letWaitingIn(ctx, waiting); err != nil {
		return 0, err
	}
	n, err := s.sweepRunning(ctx)
	if err != nil {
		return n, err
	}
	m, err := s.sweepQueued(ctx)
	return n + m, err
}

// letWaitingIn releases, for every organisation with runs waiting, its
// admitted runs that ended (or are unknown), and lets its waiting runs in
// as far as its share allows: a release may never have reached Redis (a
// failover promoted a replica that had not seen it), and a paused queue
// admitted nothing until its resume.
func (s *Sweeper) letWaitingIn(ctx context.Context, orgs []string) error {
	if s.release == nil {
		return nil
	}
	for _, org := range orgs {
		ended, err := s.endedAdmitted(ctx, org)
		if err != nil {
			return err
		}
		s.release(ctx, org, ended, 0)
	}
	return nil
}

// takeOver moves the runs of the takers that stopped back to ready, and
// returns the organisations with runs waiting at the gate.
func (s *Sweeper) takeOver(ctx context.Context) (waiting []string, err error) {
	res, err := takeOverScript.Run(ctx, s.redis, []string{takersSet, readyList, fairOrgs}, takingList, aliveKey).Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("unexpected answer %v", res)
	}
	if err != nil {
		return nil, fmt.Errorf("take over the runs of stopped workers: %w", err)
	}
	moved, _ := res[0].([]any)
	for _, v := range moved {
		raw, _ := v.(string)
		for _, id := range itemRunIDs([]string{raw}) {
			s.m.redelivered.WithLabelValues("taker_stopped").Inc()
			s.log.InfoContext(ctx, "stranded run re-enqueued", "run_id", id, "reason", "taker_stopped")
		}
	}
	orgs, _ := res[1].([]any)
	for _, v := range orgs {
		if org, ok := v.(string); ok {
			waiting = append(waiting, org)
		}
	}
	return waiting, nil
}

// sweepRunning hands on the running runs whose lease ran out.
func (s *Sweeper) sweepRunning(ctx context.Context) (int, error) {
	n := 0
	for {
		all, err := s.runs.StrandedRunning(ctx, s.batch)
		if err != nil {
			return n, err
		}
		m, err := s.handOnLost(ctx, all, "lease_expired")
		n += m
		if err != nil || len(all) < s.batch {
			return n, err
		}
	}
}

// sweepQueued pages, at most once per after, through the queued runs older
// than after, and hands on those lost.
func (s *Sweeper) sweepQueued(ctx context.Context) (int, error) {
	if !s.passActive && time.Since(s.passBegan) < s.after {
		return 0, nil
	}
	if !s.passActive {
		s.passActive, s.passBegan, s.cursor = true, time.Now(), nil
	}
	n := 0
	for {
		rs, next, err := s.runs.QueuedSince(ctx, s.after, s.cursor, s.batch)
		if err != nil {
			return n, err
		}
		m, err := s.handOnLost(ctx, rs, "queued")
		n += m
		if err != nil {
			return n, err
		}
		s.cursor = next
		if next == nil {
			s.passActive = false
			return n, nil
		}
	}
}

// handOnLost hands on the runs of rs that are lost, for reason.
func (s *Sweeper) handOnLost(ctx context.Context, rs []models.StrandedRun, reason string) (int, error) {
	lost, err := s.lost(ctx, rs)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range lost {
		ok, err := s.redeliver(ctx, r, reason)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
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
// completed.
func taskKey(taskID string) string { return "asynq:{" + queue + "}:t:" + taskID }

// lost returns the runs of rs that nothing holds: not in ready nor in the
// taking list of a taker, not waiting their turn at the gate, and with no
// retry task pending, scheduled or active in asynq. Three round trips.
func (s *Sweeper) lost(ctx context.Context, rs []models.StrandedRun) ([]models.StrandedRun, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	items, err := listedScript.Run(ctx, s.redis, []string{takersSet, readyList}, takingList).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("read the hand-off's lists: %w", err)
	}
	listed := map[string]bool{}
	for _, id := range itemRunIDs(items) {
		listed[id] = true
	}
	waits := make([]*redis.BoolCmd, len(rs))
	retries := make([]*redis.StringCmd, len(rs))
	_, err = s.redis.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range rs {
			waits[i] = p.HExists(ctx, fairPayloads, r.ID)
			retries[i] = p.HGet(ctx, retryIndex, r.ID)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read the gate and the retries: %w", err)
	}
	states := make([]*redis.StringCmd, len(rs))
	_, err = s.redis.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range retries {
			if id, err := c.Result(); err == nil {
				states[i] = p.HGet(ctx, taskKey(id), "state")
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read retry task states: %w", err)
	}
	var out []models.StrandedRun
	for i, r := range rs {
		if listed[r.ID] || waits[i].Val() || states[i] != nil && retryPending(states[i]) {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// retryPending reads a retry task's state: whether asynq will still push
// its run (pending, scheduled, retrying or active).
func retryPending(c *redis.StringCmd) bool {
	st, err := c.Result()
	return err == nil && (st == "pending" || st == "scheduled" || st == "retry" || st == "active")
}

// redeliver counts a redelivery of r, then pushes it through the gate (it
// may wait its organisation's turn); false when another sweeper counted
// it first, or its row is busy (its delivery is writing it: a later sweep
// looks again). Counting never waits on a run its own delivery is writing.
func (s *Sweeper) redeliver(ctx context.Context, r models.StrandedRun, reason string) (bool, error) {
	counted, err := s.runs.MarkRedelivered(ctx, r)
	if err != nil || !counted {
		return false, err
	}
	p := RunPayload{RunID: r.ID, OrgID: r.OrgID, Redelivery: true, Redeliveries: r.Redeliveries + 1, CreatedAt: r.CreatedAt}
	if err := s.queue.send(ctx, admission{org: r.OrgID, recorded: true, in: []RunPayload{p}}); err != nil {
		// Counted and not pushed: the next pass finds it lost again.
		return false, fmt.Errorf("redeliver run %s: %w", r.ID, err)
	}
	s.m.redelivered.WithLabelValues(reason).Inc()
	s.log.InfoContext(ctx, "stranded run re-enqueued", "run_id", r.ID, "status", r.Status,
		"reason", reason, "redelivery", r.Redeliveries+1)
	return true, nil
}

// queue is the asynq queue every task of valruns goes to.
const queue = "default"
