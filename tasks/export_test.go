package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/models"
)

// SetBeforeRun makes w's run executor call f with the execution's context
// just before it validates a run: it stands in for a validation that takes
// long (and stops when its context ends).
func SetBeforeRun(w *Worker, f func(ctx context.Context, runID string)) { w.runs.beforeRun = f }

// NoDirect makes w, before its Start, take no runs from the direct
// hand-off: the API processes hand them to asynq's queue (while no other
// worker takes).
func NoDirect(w *Worker) { w.noDirect = true }

// SetDequeued makes w's run executor tell f the runs of each task as soon
// as its handler begins.
func SetDequeued(w *Worker, f func(runIDs []string)) { w.runs.dequeued = f }

// NewRunTask is the task executing runID, as the hand-off (or, with
// redelivery, the sweeper) enqueues it, without its data inline: the
// worker reads the run.
func NewRunTask(runID string, redelivery bool) *asynq.Task {
	t, err := newRunTask(RunPayload{RunID: runID, Redelivery: redelivery}, nil)
	if err != nil {
		panic(err)
	}
	return t
}

// RunTaskID is the TaskID of a run's n-th delivery (0: the hand-off's).
func RunTaskID(runID string, n int) string { return runTaskID(runID, n) }

// TaskKey is where asynq keeps the task taskID of the default queue.
func TaskKey(taskID string) string { return taskKey(taskID) }

// SendBatch hands runs off as one batch task, as the dispatcher does when
// several wait.
func SendBatch(d *Dispatcher, runs []*models.QueuedRun) {
	if err := d.w.enqueueBatch(context.Background(), payloads(runs)); err != nil {
		panic(err)
	}
}

func payloads(runs []*models.QueuedRun) []RunPayload {
	ps := make([]RunPayload, len(runs))
	for i, q := range runs {
		ps[i] = payloadOf(q)
	}
	return ps
}

// BatchIndexKey is the Redis hash from a run to its batch task.
const BatchIndexKey = batchIndexKey

// NewRunTaskFor is the task the hand-off makes for q (its data inline).
func NewRunTaskFor(q *models.QueuedRun) *asynq.Task {
	t, err := newRunTask(payloadOf(q), nil)
	if err != nil {
		panic(err)
	}
	return t
}

// NewBatchTaskFor is the batch task the hand-off makes for qs.
func NewBatchTaskFor(qs []*models.QueuedRun) *asynq.Task {
	t, err := newBatchTask(payloads(qs), nil)
	if err != nil {
		panic(err)
	}
	return t
}

// QueueLength is how many runs wait in opt's queue (pending tasks; a batch
// counts its runs).
func QueueLength(t testing.TB, opt asynq.RedisClientOpt) int {
	t.Helper()
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	n := 0
	for page := 1; ; page++ {
		tasks, err := insp.ListPendingTasks(queue, asynq.PageSize(1000), asynq.Page(page))
		if err != nil || len(tasks) == 0 {
			return n
		}
		for _, task := range tasks {
			if task.Type != TypeRunBatch {
				n++
				continue
			}
			var b BatchPayload
			if err := json.Unmarshal(task.Payload, &b); err != nil {
				t.Fatalf("batch payload: %v", err)
			}
			n += len(b.Runs)
		}
	}
}

// GateWaiting is how many runs wait their organisation's turn at the gate.
func GateWaiting(t testing.TB, opt asynq.RedisClientOpt) int64 {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: opt.Addr, DB: opt.DB, Password: opt.Password})
	defer rc.Close()
	n, err := rc.HLen(context.Background(), fairPayloads).Result()
	if err != nil {
		t.Fatalf("gate: %v", err)
	}
	return n
}

// RunsInRedis lists the runs whose tasks are pending in the queue, and
// those waiting at the gate.
func RunsInRedis(t testing.TB, opt asynq.RedisClientOpt) (queued, waiting map[string]bool) {
	t.Helper()
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	queued = map[string]bool{}
	for page := 1; ; page++ {
		tasks, err := insp.ListPendingTasks(queue, asynq.PageSize(1000), asynq.Page(page))
		if err != nil || len(tasks) == 0 {
			break
		}
		for _, task := range tasks {
			if task.Type != TypeRunBatch {
				var p RunPayload
				if err := json.Unmarshal(task.Payload, &p); err != nil {
					t.Fatalf("run payload: %v", err)
				}
				queued[p.RunID] = true
				continue
			}
			var b BatchPayload
			if err := json.Unmarshal(task.Payload, &b); err != nil {
				t.Fatalf("batch payload: %v", err)
			}
			for _, p := range b.Runs {
				queued[p.RunID] = true
			}
		}
	}
	rc := redis.NewClient(&redis.Options{Addr: opt.Addr, DB: opt.DB, Password: opt.Password})
	defer rc.Close()
	ids, err := rc.HKeys(context.Background(), fairPayloads).Result()
	if err != nil {
		t.Fatalf("gate: %v", err)
	}
	waiting = map[string]bool{}
	for _, id := range ids {
		waiting[id] = true
	}
	return queued, waiting
}

// GateAdmitted lists the runs of org the gate counts in the queue.
func GateAdmitted(t testing.TB, opt asynq.RedisClientOpt, org string) ([]string, error) {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: opt.Addr, DB: opt.DB, Password: opt.Password})
	defer rc.Close()
	return (&gate{redis: rc}).admitted(context.Background(), org)
}

// LeaseKey is asynq's lease set of the default queue.
func LeaseKey() string { return leaseKey() }

// DirectRuns lists the runs waiting in the direct hand-off's list, in order.
func DirectRuns(t testing.TB, opt asynq.RedisClientOpt) []string {
	t.Helper()
	return listedIDs(t, opt, directRuns)
}

// listedIDs lists the runs of the direct hand-off's items in list key, in
// order.
func listedIDs(t testing.TB, opt asynq.RedisClientOpt, key string) []string {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: opt.Addr, DB: opt.DB, Password: opt.Password})
	defer rc.Close()
	raw, err := rc.LRange(context.Background(), key, 0, -1).Result()
	if err != nil {
		t.Fatalf("direct hand-off: %v", err)
	}
	return directIDs(t, raw)
}

// TakeDirectAs moves every run of the direct hand-off's list into the
// list of runs taken of worker id, as that worker's pops do, and returns
// them.
func TakeDirectAs(t testing.TB, opt asynq.RedisClientOpt, id string) []string {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: opt.Addr, DB: opt.DB, Password: opt.Password})
	defer rc.Close()
	var raw []string
	for {
		s, err := rc.LMove(context.Background(), directRuns, directTaking+id, "LEFT", "RIGHT").Result()
		if errors.Is(err, redis.Nil) {
			return directIDs(t, raw)
		}
		if err != nil {
			t.Fatalf("direct hand-off: %v", err)
		}
		raw = append(raw, s)
	}
}

func directIDs(t testing.TB, raw []string) []string {
	ids := make([]string, len(raw))
	for i, s := range raw {
		var it directItem
		if err := json.Unmarshal([]byte(s), &it); err != nil {
			t.Fatalf("direct item %q: %v", s, err)
		}
		ids[i] = it.Run.RunID
	}
	return ids
}

// SetDirectPops makes w's direct hand-off tell f how many runs each of its
// pops took, and wait up to block on the list at each.
func SetDirectPops(w *Worker, block time.Duration, f func(n int)) {
	w.direct.popped, w.direct.block = f, block
}

// DirectTaken lists the runs w's list of runs taken from the direct
// hand-off holds, in order.
func DirectTaken(t testing.TB, opt asynq.RedisClientOpt, w *Worker) []string {
	t.Helper()
	return listedIDs(t, opt, directTaking+w.direct.id)
}

// JoinDirect records a beat of worker id in the direct hand-off's
// takers, ago ago (0: now), without anything popping: runs pushed stay in
// the list.
func JoinDirect(t testing.TB, opt asynq.RedisClientOpt, id string, ago time.Duration) {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: opt.Addr, DB: opt.DB, Password: opt.Password})
	defer rc.Close()
	if err := directTakeScript.Run(context.Background(), rc, []string{directTakers}, id, ago.Milliseconds()).Err(); err != nil {
		t.Fatalf("join the direct hand-off: %v", err)
	}
}

// DirectPerTaker is the most runs the direct hand-off's list holds per
// worker taking from it.
const DirectPerTaker = directPerTaker

// DirectItemJSON builds a direct hand-off item from a payload's JSON;
// DecodeDirectItem reads one as a worker does.
var DirectItemJSON = directItemJSON

func DecodeDirectItem(b []byte) (RunPayload, map[string]string, error) {
	var it directItem
	err := json.Unmarshal(b, &it)
	return it.Run, it.Headers, err
}
