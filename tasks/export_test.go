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

// SetDequeued makes w's run executor tell f the run of each delivery as
// soon as it begins.
func SetDequeued(w *Worker, f func(runIDs []string)) { w.runs.dequeued = f }

// SetTakerBlock makes w's taker wait at most block on the ready list at
// each take (before Start).
func SetTakerBlock(w *Worker, block time.Duration) { w.taker.block = block }

// NewRunTask is a retry's task for runID (or a run task an earlier version
// left in Redis), without its data inline: the worker reads the run.
func NewRunTask(runID string, redelivery bool) *asynq.Task {
	t, err := newRunTask(RunPayload{RunID: runID, Redelivery: redelivery}, nil)
	if err != nil {
		panic(err)
	}
	return t
}

// NewRunTaskFor is the run task an earlier version made for q (its data
// inline).
func NewRunTaskFor(q *models.QueuedRun) *asynq.Task {
	t, err := newRunTask(payloadOf(q), nil)
	if err != nil {
		panic(err)
	}
	return t
}

// NewBatchTaskFor is the batch task an earlier version made for qs.
func NewBatchTaskFor(qs []*models.QueuedRun) *asynq.Task {
	ps := make([]RunPayload, len(qs))
	for i, q := range qs {
		ps[i] = payloadOf(q)
	}
	b, err := json.Marshal(BatchPayload{Runs: ps})
	if err != nil {
		panic(err)
	}
	return asynq.NewTask(TypeRunBatch, b)
}

// TaskKey is where asynq keeps the task taskID of the default queue.
func TaskKey(taskID string) string { return taskKey(taskID) }

// RetryTaskID is the TaskID of a run's n-th retry.
func RetryTaskID(runID string, n int) string { return retryTaskID(runID, n) }

// Hand-off keys, for tests that play a worker by hand.
const (
	ReadyList  = readyList
	TakingList = takingList
	TakersSet  = takersSet
	AliveKey   = aliveKey
	RetryIndex = retryIndex
)

func client(opt asynq.RedisClientOpt) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: opt.Addr, DB: opt.DB, Password: opt.Password})
}

// ReadyRuns lists the runs in the ready list, in order.
func ReadyRuns(t testing.TB, opt asynq.RedisClientOpt) []string {
	t.Helper()
	return listedIDs(t, opt, readyList)
}

// TakenBy lists the runs in taker id's taking list, in order.
func TakenBy(t testing.TB, opt asynq.RedisClientOpt, id string) []string {
	t.Helper()
	return listedIDs(t, opt, takingList+id)
}

// TakerID is w's taker's id.
func TakerID(w *Worker) string { return w.taker.id }

func listedIDs(t testing.TB, opt asynq.RedisClientOpt, key string) []string {
	t.Helper()
	rc := client(opt)
	defer rc.Close()
	raw, err := rc.LRange(context.Background(), key, 0, -1).Result()
	if err != nil {
		t.Fatalf("hand-off: %v", err)
	}
	ids := make([]string, len(raw))
	for i, s := range raw {
		var it handoffItem
		if err := json.Unmarshal([]byte(s), &it); err != nil {
			t.Fatalf("hand-off item %q: %v", s, err)
		}
		ids[i] = it.Run.RunID
	}
	return ids
}

// TakeAs moves every run of the ready list into the taking list of taker
// id, as that taker's takes do, without the taker beating: a taker that
// died with them. It returns them.
func TakeAs(t testing.TB, opt asynq.RedisClientOpt, id string) []string {
	t.Helper()
	rc := client(opt)
	defer rc.Close()
	ctx := context.Background()
	if err := rc.SAdd(ctx, takersSet, id).Err(); err != nil {
		t.Fatalf("hand-off: %v", err)
	}
	for {
		err := rc.LMove(ctx, readyList, takingList+id, "LEFT", "RIGHT").Err()
		if errors.Is(err, redis.Nil) {
			return listedIDs(t, opt, takingList+id)
		}
		if err != nil {
			t.Fatalf("hand-off: %v", err)
		}
	}
}

// DecodeItem reads a hand-off item as a worker does.
func DecodeItem(b []byte) (RunPayload, map[string]string, error) {
	var it handoffItem
	err := json.Unmarshal(b, &it)
	return it.Run, it.Headers, err
}

// GateWaiting is how many runs wait their organisation's turn at the gate.
func GateWaiting(t testing.TB, opt asynq.RedisClientOpt) int64 {
	t.Helper()
	rc := client(opt)
	defer rc.Close()
	n, err := rc.HLen(context.Background(), fairPayloads).Result()
	if err != nil {
		t.Fatalf("gate: %v", err)
	}
	return n
}

// RunsInRedis lists the runs in the ready list, and those waiting at the
// gate.
func RunsInRedis(t testing.TB, opt asynq.RedisClientOpt) (ready, waiting map[string]bool) {
	t.Helper()
	ready = map[string]bool{}
	for _, id := range ReadyRuns(t, opt) {
		ready[id] = true
	}
	rc := client(opt)
	defer rc.Close()
	ids, err := rc.HKeys(context.Background(), fairPayloads).Result()
	if err != nil {
		t.Fatalf("gate: %v", err)
	}
	waiting = map[string]bool{}
	for _, id := range ids {
		waiting[id] = true
	}
	return ready, waiting
}

// GateAdmitted lists the runs of org the gate counts in the queue.
func GateAdmitted(t testing.TB, opt asynq.RedisClientOpt, org string) ([]string, error) {
	t.Helper()
	rc := client(opt)
	defer rc.Close()
	return (&gate{redis: rc}).admitted(context.Background(), org)
}

// Deliver makes one delivery of the run of task (a run task's payload) in
// w, as its taker does with an item, and returns the attempt's error: a
// test's stand-in for a delivery.
func Deliver(ctx context.Context, w *Worker, task *asynq.Task) error {
	var p RunPayload
	if err := json.Unmarshal(task.Payload(), &p); err != nil || p.RunID == "" {
		return asynq.SkipRetry
	}
	return w.runs.attempt(withTries(ctx, p.Retries, w.runs.maxAttempts-1), p, func() {})
}

// Gate is the fair-share gate on rc with a fixed default share and stale.
type Gate struct{ g *gate }

func NewGate(rc redis.UniversalClient, share int, stale time.Duration) Gate {
	return Gate{&gate{redis: rc, share: share, stale: stale}}
}

// Admit hands runs ids of org to the gate (created now, in order) and
// releases the runs released; it returns the runs the gate admitted.
func (g Gate) Admit(ctx context.Context, org string, ids, released []string) ([]string, error) {
	a := admission{org: org, recorded: len(ids) == 0, released: released}
	for _, id := range ids {
		p := RunPayload{RunID: id, OrgID: org, CreatedAt: time.Now()}
		item, err := itemJSON(p, nil)
		if err != nil {
			return nil, err
		}
		a.in, a.items = append(a.in, p), append(a.items, item)
	}
	let, err := g.g.pass(ctx, a)
	return let.admitted, err
}
