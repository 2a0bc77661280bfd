package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// The hand-off. Every run the gate admits is pushed onto one Redis list,
// ready; each worker has one taker that waits on it (BLMOVE, no poll) and
// moves what it takes into a list of its own, taking, until the run is
// final or handed on. A taker that dies leaves its list behind; once its
// alive key runs out (RUN_LEASE) a sweep moves that list back to ready.
// asynq carries only what must wait: a failed attempt's retry (pushed onto
// ready when due) and the periodic cleanup.
//
// The keys share the hash tag of asynq's queue; the gate's script (keys
// tagged {fair}) pushes onto ready too, so valruns needs a Redis that holds
// every key: a single node or Sentinel's primary, not a Cluster.
const (
	// readyList holds the runs admitted and not taken yet (handoffItem, JSON).
	readyList = "valruns:{" + queue + "}:ready"
	// takingList + taker id: the runs that taker took and has not finished.
	takingList = "valruns:{" + queue + "}:taking:"
	// takersSet holds the ids of the takers, alive or not yet swept.
	takersSet = "valruns:{" + queue + "}:takers"
	// aliveKey + taker id exists while the taker beats (PX RUN_LEASE).
	aliveKey = "valruns:{" + queue + "}:alive:"
	// retryIndex maps a run waiting for a retry to its asynq task's id.
	retryIndex = "valruns:{" + queue + "}:retrying"
	// queuePaused is asynq's flag of a paused queue: the gate admits
	// nothing while it is set.
	queuePaused = "asynq:{" + queue + "}:paused"
)

const (
	// takerBlock bounds one wait on ready: an idle worker sends one
	// command per takerBlock (a stopping one closes its connection).
	takerBlock = 30 * time.Second
	// takerBeat is how often a taker renews its alive key and its place
	// in takersSet, at most: a third of RUN_LEASE when that is shorter, so
	// a live taker's key never runs out between two beats.
	takerBeat = 5 * time.Second
	// takeMore is the most runs a taker takes without waiting, besides the
	// one its wait returned, in the same round trip.
	takeMore = 16
)

// handoffItem is one run in ready or a taking list: its payload, and the
// trace context of its hand-off (nil when not traced).
type handoffItem struct {
	Run     RunPayload        `json:"run"`
	Headers map[string]string `json:"headers,omitempty"`
}

// itemJSON is a handoffItem's JSON.
func itemJSON(p RunPayload, headers map[string]string) ([]byte, error) {
	b, err := json.Marshal(handoffItem{Run: p, Headers: headers})
	if err != nil {
		return nil, fmt.Errorf("run payload: %w", err)
	}
	return b, nil
}

// itemRunIDs are the runs of raw items (those that decode).
func itemRunIDs(raw []string) []string {
	var ids []string
	for _, s := range raw {
		var it handoffItem
		if json.Unmarshal([]byte(s), &it) == nil && it.Run.RunID != "" {
			ids = append(ids, it.Run.RunID)
		}
	}
	return ids
}

// takeMoreLua moves up to ARGV[1] items from KEYS[1] (ready) to KEYS[2] (a
// taking list) and returns them, without waiting.
const takeMoreLua = `
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local v = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not v then break end
  out[#out + 1] = v
end
return out
`

// giveBackScript removes the items done (ARGV[2..]) from a taker's taking
// list (KEYS[1]), moves the rest back to the head of ready (KEYS[2]) in
// their order, and forgets the taker: ARGV[1] leaves takersSet (KEYS[3]),
// its alive key (KEYS[4]) is deleted.
var giveBackScript = redis.NewScript(`
for i = 2, #ARGV do
  redis.call('LREM', KEYS[1], 1, ARGV[i])
end
local n = 0
while redis.call('RPOPLPUSH', KEYS[1], KEYS[2]) do
  n = n + 1
end
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('DEL', KEYS[4])
return n
`)

// takeOverScript moves the taking list of every taker in KEYS[1] whose
// alive key (ARGV[2] .. id) is gone back to the head of ready (KEYS[2]),
// and forgets the taker; ARGV[1] is the taking lists' prefix. It returns
// the items it moved, and the organisations with runs waiting at the gate
// (KEYS[3]): one call for a sweep's reads of Redis while idle.
var takeOverScript = redis.NewScript(`
local moved = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', ARGV[2] .. id) == 0 then
    while true do
      local item = redis.call('RPOPLPUSH', ARGV[1] .. id, KEYS[2])
      if not item then break end
      moved[#moved + 1] = item
    end
    redis.call('SREM', KEYS[1], id)
  end
end
return {moved, redis.call('SMEMBERS', KEYS[3])}
`)

// listedScript returns every item of ready (KEYS[2]) and of the taking
// lists of the takers in KEYS[1] (ARGV[1] .. id).
var listedScript = redis.NewScript(`
local out = redis.call('LRANGE', KEYS[2], 0, -1)
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  for _, item in ipairs(redis.call('LRANGE', ARGV[1] .. id, 0, -1)) do
    out[#out + 1] = item
  end
end
return out
`)

// newTakerID names a taker: host:pid:random.
func newTakerID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), uuid.NewString()[:8])
}

// taker is a worker's side of the hand-off: it takes runs from ready into
// its free slots, one wait at a time, and executes each (run). A slot is
// held while a run computes; a run whose outcome is computed moves to
// writing, where it waits for its final write and the gate's release, so
// that waiting on PostgreSQL and Redis does not keep the next run out.
type taker struct {
	redis redis.UniversalClient
	// pop is a client of its own, for the blocking takes: closed to stop
	// one at once.
	pop redis.UniversalClient
	id  string
	// run executes one run, calling computed (if at all) once its outcome
	// is computed; handBack: the worker is stopping and the run goes back
	// to ready.
	run func(it handoffItem, computed func()) (handBack bool)
	// slots bounds the runs computing (WORKER_CONCURRENCY); writing, the
	// runs computed and waiting for their write (writingMax).
	slots, writing chan struct{}
	lease          time.Duration
	log            *slog.Logger
	// block bounds one wait on ready (takerBlock; tests set shorter).
	block time.Duration

	// done are the items finished since the last take, which removes them
	// from the taking list in its round trip; inflight, the items under way.
	mu       sync.Mutex
	done     []string
	inflight map[string]int

	cancel context.CancelFunc
	loops  sync.WaitGroup // the beat and the fetch
	execs  sync.WaitGroup // the runs under way
}

// writingMax bounds the runs computed and waiting for their final write
// and release: as many as the finisher's writers batch at once.
const writingMax = finishBatchMax * finishWriters

func newTaker(rc, pop redis.UniversalClient, slots int, lease time.Duration, run func(handoffItem, func()) bool, log *slog.Logger) *taker {
	return &taker{redis: rc, pop: pop, id: newTakerID(), run: run, slots: make(chan struct{}, max(slots, 1)),
		writing: make(chan struct{}, writingMax), lease: lease, log: log, block: takerBlock, inflight: map[string]int{}}
}

// start joins the takers and begins taking.
func (t *taker) start() {
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	t.beat(ctx)
	t.loops.Go(func() {
		tick := time.NewTicker(min(takerBeat, t.lease/3))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				t.beat(ctx)
			}
		}
	})
	t.loops.Go(func() { t.fetch(ctx) })
}

// beat keeps the taker alive for a lease and in takersSet: a taker a sweep
// left out (its beats did not reach Redis in time) joins again.
func (t *taker) beat(ctx context.Context) {
	bctx, cancel := context.WithTimeout(ctx, min(takerBeat, t.lease/3))
	defer cancel()
	_, err := t.redis.Pipelined(bctx, func(p redis.Pipeliner) error {
		p.Set(bctx, aliveKey+t.id, 1, t.lease)
		p.SAdd(bctx, takersSet, t.id)
		return nil
	})
	if err != nil && ctx.Err() == nil {
		t.log.Warn("could not renew the worker's place in the hand-off", "error", err)
	}
}

// fetch takes runs whenever a slot is free, until ctx ends: it waits with
// one slot, and takes without waiting as many more as are free.
func (t *taker) fetch(ctx context.Context) {
	for {
		select {
		case t.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		more := 0
		for more < takeMore && t.tryReserve() {
			more++
		}
		raws, ok := t.take(ctx, more)
		for range 1 + more - len(raws) {
			<-t.slots
		}
		for _, raw := range raws {
			t.execute(raw)
		}
		if !ok {
			return
		}
	}
}

func (t *taker) tryReserve() bool {
	select {
	case t.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// execute runs raw's run in the slot reserved for it, then marks it done
// unless it is to be handed back.
func (t *taker) execute(raw string) {
	var it handoffItem
	if json.Unmarshal([]byte(raw), &it) != nil || it.Run.RunID == "" {
		<-t.slots
		t.log.Warn("dropped a malformed item of the hand-off", "item", raw)
		t.markDone(raw)
		return
	}
	t.mu.Lock()
	t.inflight[raw]++
	t.mu.Unlock()
	t.execs.Go(func() {
		held := t.slots
		computed := func() {
			if held == t.slots {
				t.writing <- struct{}{} // a place to wait first: a full writing holds the slot
				<-t.slots
				held = t.writing
			}
		}
		handBack := t.run(it, computed)
		<-held
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.inflight[raw]--; t.inflight[raw] <= 0 {
			delete(t.inflight, raw)
		}
		if !handBack {
			t.done = append(t.done, raw)
		}
	})
}

// orphans are up to n items of the taking list that are neither under way
// nor done: moved there by a take whose answer never arrived (a read cut
// off by a timeout, say, after the worker was stopped for long). Nothing
// else would execute them while the taker beats.
func (t *taker) orphans(ctx context.Context, n int) []string {
	raws, err := t.redis.LRange(ctx, takingList+t.id, 0, -1).Result()
	if err != nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	skip := maps.Clone(t.inflight)
	for _, raw := range t.done {
		skip[raw]++
	}
	var out []string
	for _, raw := range raws {
		if len(out) == n {
			break
		}
		if skip[raw] > 0 {
			skip[raw]--
			continue
		}
		out = append(out, raw)
	}
	return out
}

// take waits for a run and moves it into the taking list, and in the same
// round trip up to more besides (a pipeline: the script runs once the wait
// is over); the round trip first removes the items done since the last.
// It returns what it moved; false once ctx ends.
func (t *taker) take(ctx context.Context, more int) ([]string, bool) {
	for {
		done := t.takeDone()
		var first *redis.StringCmd
		var rest *redis.Cmd
		removed := make([]*redis.IntCmd, len(done))
		_, _ = t.pop.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, raw := range done {
				removed[i] = p.LRem(ctx, takingList+t.id, 1, raw)
			}
			first = p.BLMove(ctx, readyList, takingList+t.id, "LEFT", "RIGHT", t.block)
			if more > 0 {
				rest = p.Eval(ctx, takeMoreLua, []string{readyList, takingList + t.id}, more)
			}
			return nil
		})
		for i, c := range removed {
			if c.Err() != nil {
				t.markDone(done[i]) // the next round trip, or the give-back, tries again
			}
		}
		var raws []string
		raw, err := first.Result()
		if err == nil {
			raws = append(raws, raw)
		}
		if rest != nil {
			if vs, rerr := rest.StringSlice(); rerr == nil {
				raws = append(raws, vs...)
			}
		}
		switch {
		case len(raws) > 0:
			return raws, ctx.Err() == nil
		case ctx.Err() != nil:
			return nil, false
		case !errors.Is(err, redis.Nil):
			t.log.Debug("could not wait on the hand-off", "error", err)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return nil, false
			}
			if raws := t.orphans(ctx, 1+more); len(raws) > 0 {
				return raws, true
			}
		}
	}
}

func (t *taker) markDone(raw string) {
	t.mu.Lock()
	t.done = append(t.done, raw)
	t.mu.Unlock()
}

func (t *taker) takeDone() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	done := t.done
	t.done = nil
	return done
}

// stopTaking stops the waits: the runs taken already go on.
func (t *taker) stopTaking() {
	_ = t.pop.Close()
	if t.cancel == nil {
		return
	}
	t.cancel()
	t.loops.Wait()
}

// wait waits, up to timeout, for the runs under way.
func (t *taker) wait(timeout time.Duration) {
	idle := make(chan struct{})
	go func() {
		t.execs.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-time.After(timeout):
	}
}

// giveBack puts the runs the taker took and did not finish back at the
// head of ready, and leaves the takers. Failing, a sweep does it once the
// alive key runs out.
func (t *taker) giveBack() {
	if t.cancel == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	args := []any{t.id}
	for _, raw := range t.takeDone() {
		args = append(args, raw)
	}
	n, err := giveBackScript.Run(ctx, t.redis, []string{takingList + t.id, readyList, takersSet, aliveKey + t.id}, args...).Int()
	if err != nil {
		t.log.Warn("could not give back the runs taken; a sweep will, after RUN_LEASE", "error", err)
		return
	}
	if n > 0 {
		t.log.Info("gave back the runs taken and not finished", "runs", n)
	}
}
