package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// The direct hand-off. A new run the gate lets into the queue is pushed
// onto a Redis list that the workers' lanes wait on (BLPOP), when some
// worker waits there and the list is short (directPerTaker runs per worker
// waiting): the worker whose
// pop returns executes it at once, by the fast path, in one of its lane's
// slots (localLane), and releases it from the gate when it is final. No
// enqueue script, no poll and no dequeue script stand between a committed
// start and an idle worker: one push, and a pop that was already waiting.
//
// asynq carries everything else, as before: redeliveries, the runs a fast
// path could not decide (they go back through the gate as redeliveries,
// executed under a claim), the runs let in from the gate's waiting list as
// others finish, and any new run while no worker waits or the list is full.
//
// Nothing is lost. A worker pops a run by moving it, atomically, into a
// list of its own (directTaking), with as many more as the list holds and
// its slots are free for, in the same round trip; it removes a run from
// there once the run is final or handed on, in the round trip of its next
// pop. A worker that dies or stops stops renewing its
// place in directTakers; once it has not for RUN_LEASE, a sweep redelivers
// the queued runs its list holds, as it does a stopped worker's asynq
// tasks. A run still queued in PostgreSQL with no task in asynq, and in no
// list, is enqueued by the sweeper after RUN_REDELIVER_AFTER, as ever; a
// worker that stops hands what the shared list holds to asynq when no other
// worker takes from it. Nothing executes twice: a move is atomic, and
// every final write is fenced (a run redelivered meanwhile is written once).
//
// A queue paused (asynq's PauseQueue, as asynqmon does) pauses the direct
// hand-off too: new runs then wait in asynq's queue.
//
// The keys share the hash tag of asynq's queue, as its paused flag. The
// gate's script pushes onto the list too (its keys tagged {fair}): one call
// for both takes a Redis that holds every key, a single node or Sentinel's
// primary, which is what valruns connects to (REDIS_URL), not a Cluster.
const (
	// directRuns is the list of runs handed off directly (directItem, JSON).
	directRuns = "valruns:{" + queue + "}:direct"
	// directTakers holds the workers taking from directRuns: worker id ->
	// its last beat (every directBeat), Redis's clock in ms. A worker whose
	// last beat is older than directFresh is not pushed to; one whose last
	// beat is older than RUN_LEASE has stopped, and a sweep redelivers its
	// runs.
	directTakers = "valruns:{" + queue + "}:direct_takers"
	// directTaking + worker id: the runs that worker popped and has not
	// finished or handed on (directItem, JSON).
	directTaking = "valruns:{" + queue + "}:direct_taking:"
	// queuePaused is asynq's flag of a paused queue.
	queuePaused = "asynq:{" + queue + "}:paused"
)

const (
	// directPerTaker is the most runs the list holds per worker taking
	// from it: past it, new runs go to asynq, in batch tasks, whose task
	// server executes them in its own slots. A list longer than a few runs
	// is a backlog, which asynq's batches drain at less cost per run
	// (measured when a worker popped one run per round trip: a list of up
	// to 128 halved what a loaded machine finished at 128 clients).
	directPerTaker = 4
	// directBeat is how often a worker renews its place in directTakers;
	// runs are pushed while some worker renewed it within directFresh.
	directBeat  = time.Second
	directFresh = 3 * time.Second
	// directTakeMore is the most runs a worker takes from the list, with
	// free slots, besides the one it waited for, in the same round trip.
	directTakeMore = 2 * directPerTaker
	// directBlock bounds one wait on the list (Redis's least is a second;
	// a stopping worker closes its connection instead of waiting it out).
	directBlock = time.Second
)

// directItem is one run in directRuns: its task payload, and the trace
// context of its hand-off (nil when not traced).
type directItem struct {
	Run     RunPayload        `json:"run"`
	Headers map[string]string `json:"headers,omitempty"`
}

// directPushLua defines direct_push, which pushes ARGV[first..last] onto
// the list when a worker beat in takers within the last fresh ms and the
// queue is not paused, up to per items in the list per such worker; it
// returns how many it pushed (the first ones), -1 when no worker takes or
// the queue is paused. The gate's script pushes new runs with it in the
// call that admits them; directPushScript, the runs let in otherwise.
const directPushLua = `
local function direct_push(list, takers, paused, per, fresh, first, last)
  local t = redis.call('TIME')
  local since = t[1] * 1000 + math.floor(t[2] / 1000) - fresh
  local waiting = redis.call('ZCOUNT', takers, since, '+inf')
  if waiting == 0 or redis.call('EXISTS', paused) == 1 then
    return -1
  end
  local n = math.min(per * waiting - redis.call('LLEN', list), last - first + 1)
  if n <= 0 then
    return 0
  end
  redis.call('RPUSH', list, unpack(ARGV, first, first + n - 1))
  return n
end
`

// directPushScript is direct_push of the items in ARGV[3..] onto KEYS[1],
// with KEYS[2] its workers taking, KEYS[3] the paused flag, ARGV[1] the
// items per worker and ARGV[2] how recent a beat must be (ms).
var directPushScript = redis.NewScript(directPushLua + `
return direct_push(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), tonumber(ARGV[2]), 3, #ARGV)
`)

// directTakeMoreLua moves up to ARGV[1] items from KEYS[1] (the list) to
// KEYS[2] (a worker's list of runs taken) and returns them, without
// waiting: the runs a worker takes besides the one its wait returned.
const directTakeMoreLua = `
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local v = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
  if not v then break end
  out[#out + 1] = v
end
return out
`

// directTakeScript records worker ARGV[1]'s beat in KEYS[1], ARGV[2] ms
// ago (0: now), by Redis's clock (the pushers' and the sweepers' too).
var directTakeScript = redis.NewScript(`
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], t[1] * 1000 + math.floor(t[2] / 1000) - tonumber(ARGV[2]), ARGV[1])
return 1
`)

// pushDirect hands runs (new ones: none is a redelivery) to a waiting
// worker, as far as one waits and the list has room, and returns how many
// of them, from the first, it handed.
func (w queueWriter) pushDirect(ctx context.Context, runs []RunPayload) (int, error) {
	if len(runs) == 0 || !w.direct.worth() {
		return 0, nil
	}
	raw, err := payloadsJSON(runs)
	if err != nil {
		return 0, err
	}
	items, ends, err := w.directItems(ctx, runs, raw)
	if err != nil {
		return 0, err
	}
	args := make([]any, 0, 2+len(items))
	args = append(args, directPerTaker, directFresh.Milliseconds())
	for _, it := range items {
		args = append(args, it)
	}
	n, err := directPushScript.Run(ctx, w.redis, []string{directRuns, directTakers, queuePaused}, args...).Int()
	ends(err)
	if err != nil {
		return 0, fmt.Errorf("hand runs to a waiting worker: %w", err)
	}
	if n == notTaken {
		w.direct.noTakerSince(time.Now())
		return 0, nil
	}
	return n, nil
}

// directItems are the direct hand-off's items of runs (raw: their
// payloads as JSON, one per run), each with the trace context of its
// hand-off when tracing is on; end ends those spans with the push's error
// (a run not pushed has a span of its own for its enqueue to asynq).
func (w queueWriter) directItems(ctx context.Context, runs []RunPayload, raw [][]byte) (items [][]byte, end func(error), err error) {
	var ends []func(error)
	end = func(err error) {
		for _, e := range ends {
			e(err)
		}
	}
	for i, p := range runs {
		var headers map[string]string
		if w.tracer != nil {
			var e func(error)
			_, headers, e = w.traceEnqueueOne(ctx, p, "direct:"+p.RunID)
			ends = append(ends, e)
		}
		b, err := directItemJSON(raw[i], headers)
		if err != nil {
			end(err)
			return nil, nil, fmt.Errorf("run payload: %w", err)
		}
		items = append(items, b)
	}
	return items, end, nil
}

// payloadsJSON is each run's payload as JSON.
func payloadsJSON(runs []RunPayload) ([][]byte, error) {
	raw := make([][]byte, len(runs))
	for i, p := range runs {
		b, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("run payload: %w", err)
		}
		raw[i] = b
	}
	return raw, nil
}

// directItemJSON is a directItem's JSON from its run's payload as JSON
// (json.Marshal's of a RunPayload): the payload is not marshalled again.
func directItemJSON(run []byte, headers map[string]string) ([]byte, error) {
	b := make([]byte, 0, len(run)+16)
	b = append(b, `{"run":`...)
	b = append(b, run...)
	if len(headers) > 0 {
		h, err := json.Marshal(headers)
		if err != nil {
			return nil, err
		}
		b = append(b, `,"headers":`...)
		b = append(b, h...)
	}
	return append(b, '}'), nil
}

// directState is what a queueWriter knows of the direct hand-off: when it
// last found no worker taking, so that it does not ask again for a while.
type directState struct {
	none atomic.Int64 // unix ns; 0: a worker was taking when last asked
}

// directNoneFor is how long a writer that found no worker taking hands its
// runs straight to asynq before it asks again.
const directNoneFor = time.Second

func (d *directState) noTakerSince(t time.Time) { d.none.Store(t.UnixNano()) }

// worth reports whether a push may find a worker taking.
func (d *directState) worth() bool {
	t := d.none.Load()
	return t == 0 || time.Since(time.Unix(0, t)) > directNoneFor
}

// directDrainScript, when no worker beat in KEYS[2] lately (as
// directPushScript, ARGV[2]), takes up to ARGV[1] items from KEYS[1] and
// returns them; else it returns none.
var directDrainScript = redis.NewScript(`
local t = redis.call('TIME')
local fresh = t[1] * 1000 + math.floor(t[2] / 1000) - tonumber(ARGV[2])
if redis.call('ZCOUNT', KEYS[2], fresh, '+inf') > 0 then
  return {}
end
local n = tonumber(ARGV[1])
local items = redis.call('LRANGE', KEYS[1], 0, n - 1)
redis.call('LTRIM', KEYS[1], n, -1)
return items
`)

// directLeaveScript removes worker ARGV[1] from KEYS[1] and deletes its
// list of runs taken, KEYS[2], returning what that list held.
var directLeaveScript = redis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
local items = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('DEL', KEYS[2])
return items
`)

// directExpiredScript removes from KEYS[1] the workers that did not beat
// for ARGV[2] ms (RUN_LEASE: they stopped), deletes their lists of runs
// taken (ARGV[1] + id) and returns what those held.
var directExpiredScript = redis.NewScript(`
local t = redis.call('TIME')
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (t[1] * 1000 + math.floor(t[2] / 1000) - tonumber(ARGV[2])))
local out = {}
for _, id in ipairs(ids) do
  local key = ARGV[1] .. id
  for _, item in ipairs(redis.call('LRANGE', key, 0, -1)) do
    out[#out + 1] = item
  end
  redis.call('DEL', key)
  redis.call('ZREM', KEYS[1], id)
end
return out
`)

// directListedScript returns the items of KEYS[2] (the shared list) and
// of the lists of runs taken (ARGV[1] + id) of the workers in KEYS[1]
// that beat within ARGV[2] ms (RUN_LEASE).
var directListedScript = redis.NewScript(`
local t = redis.call('TIME')
local out = redis.call('LRANGE', KEYS[2], 0, -1)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], t[1] * 1000 + math.floor(t[2] / 1000) - tonumber(ARGV[2]), '+inf')) do
  for _, item in ipairs(redis.call('LRANGE', ARGV[1] .. id, 0, -1)) do
    out[#out + 1] = item
  end
end
return out
`)

// directRunIDs are the runs of raw items of the direct hand-off (those
// that decode).
func directRunIDs(raw []string) []string {
	var ids []string
	for _, s := range raw {
		var it directItem
		if json.Unmarshal([]byte(s), &it) == nil && it.Run.RunID != "" {
			ids = append(ids, it.Run.RunID)
		}
	}
	return ids
}

// directTaker is a worker's side of the direct hand-off: it pops runs into
// its lane's free slots, one wait at a time, while counted as taking.

// newDirectID names a worker in directTakers: host:pid:random.
func newDirectID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), uuid.NewString()[:8])
}

// newDirectTaker is the direct hand-off's taker of a worker whose lane is
// lane.
func newDirectTaker(lane *localLane, rc, pop redis.UniversalClient, handBack func(context.Context, RunPayload) error, log *slog.Logger) *directTaker {
	return &directTaker{lane: lane, redis: rc, pop: pop, id: newDirectID(), handBack: handBack, log: log, block: directBlock}
}

type directTaker struct {
	lane  *localLane
	redis redis.UniversalClient
	// pop is a client of its own, for the blocking pops: closed to stop
	// one at once.
	pop redis.UniversalClient
	// id names the worker in directTakers: host:pid:random, so that an
	// operator, or a test, can tell whose runs a list holds.
	id string
	// handBack enqueues to asynq a run popped when the lane had closed,
	// or left in the list by the last worker stopping.
	handBack func(ctx context.Context, p RunPayload) error
	log      *slog.Logger
	// forgotten are the runs done (final, or handed on) since the last
	// pop, which removes them from the worker's list of runs taken in its
	// round trip.
	mu        sync.Mutex
	forgotten []string
	// block bounds one wait on the list (directBlock; tests set longer).
	block time.Duration
	// popped, when set (tests), is told how many runs each pop took.
	popped func(n int)

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// start counts the worker as taking and begins popping.
func (d *directTaker) start() {
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.beat(ctx)
	d.wg.Go(func() {
		t := time.NewTicker(directBeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				d.beat(ctx)
			}
		}
	})
	d.lane.slots <- struct{}{} // the slot the first pop waits with, taken before RunHere may take any
	d.wg.Go(func() { d.fetch(ctx) })
}

// beat counts the worker as taking for three beats more.
func (d *directTaker) beat(ctx context.Context) {
	bctx, cancel := context.WithTimeout(ctx, directBeat)
	defer cancel()
	if err := directTakeScript.Run(bctx, d.redis, []string{directTakers}, d.id, 0).Err(); err != nil && ctx.Err() == nil {
		d.log.Debug("could not renew the worker's place in the direct hand-off", "error", err)
	}
}

// fetch pops runs whenever a slot is free, until ctx ends. It holds the
// slot it waits with (the lane's one more than RunHere takes), so that a
// pop always has somewhere to execute, and takes without waiting the free
// slots of the runs the same round trip may take besides (popSome).
func (d *directTaker) fetch(ctx context.Context) {
	l := d.lane
	for first := true; ; first = false {
		if !first { // start took the first
			select {
			case l.slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
		more := 0
	reserve:
		for more < directTakeMore {
			select {
			case l.slots <- struct{}{}:
				more++
			default:
				break reserve
			}
		}
		raws, ok := d.popSome(ctx, more)
		if d.popped != nil && len(raws) > 0 {
			d.popped(len(raws))
		}
		for range 1 + more - len(raws) {
			<-l.slots
		}
		for _, raw := range raws {
			d.take(raw)
		}
		if !ok {
			return
		}
	}
}

// take executes the run of raw, an item popped holding a slot of the lane,
// and then forgets it (done).
func (d *directTaker) take(raw string) {
	l := d.lane
	var it directItem
	if json.Unmarshal([]byte(raw), &it) != nil || it.Run.RunID == "" {
		<-l.slots
		d.log.Warn("dropped a malformed item of the direct hand-off", "item", raw)
		d.done(raw)
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.slots
		d.giveBack(it.Run)
		d.done(raw)
		return
	}
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		l.execute(it, true)
		<-l.slots
		d.done(raw)
	}()
}

// popSome waits for a run and moves it into the worker's list of runs
// taken, and in the same round trip up to more runs besides that the list
// holds then (a pipeline: the script runs once the wait is over). The
// round trip first removes the runs done since the last from the list of
// runs taken (done). It returns what it moved; false once ctx ends (with
// what a last round trip moved, which the caller still executes).
func (d *directTaker) popSome(ctx context.Context, more int) ([]string, bool) {
	for {
		d.mu.Lock()
		forget := d.forgotten
		d.forgotten = nil
		d.mu.Unlock()
		var first *redis.StringCmd
		var rest *redis.Cmd
		removed := make([]*redis.IntCmd, len(forget))
		_, _ = d.pop.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, raw := range forget {
				removed[i] = p.LRem(ctx, directTaking+d.id, 1, raw)
			}
			first = p.BLMove(ctx, directRuns, directTaking+d.id, "LEFT", "RIGHT", d.block)
			if more > 0 {
				rest = p.Eval(ctx, directTakeMoreLua, []string{directRuns, directTaking + d.id}, more)
			}
			return nil
		})
		for i, c := range removed {
			if c.Err() != nil && ctx.Err() == nil {
				d.done(forget[i]) // the next round trip tries again
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
			d.log.Debug("could not wait on the direct hand-off", "error", err)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return nil, false
			}
		}
	}
}

// done marks raw's run done (final, or handed on): the next pop removes it
// from the worker's list of runs taken, in its round trip. Until then, or
// if the worker stops first, the list still holds it, which is harmless:
// what a sweep or the worker's leaving finds there is redelivered only
// while still queued, and every final write is fenced.
func (d *directTaker) done(raw string) {
	d.mu.Lock()
	d.forgotten = append(d.forgotten, raw)
	d.mu.Unlock()
}

// giveBack enqueues p to asynq; failing, the sweeper will.
func (d *directTaker) giveBack(p RunPayload) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.handBack(ctx, p); err != nil {
		d.log.Warn("could not hand a run of the direct hand-off to the queue; the sweeper will", "run_id", p.RunID, "error", err)
	}
}

// stop stops popping: runs popped already execute in the lane, which the
// worker closes next (leave). If no other worker takes, the runs the
// shared list holds go to asynq.
func (d *directTaker) stop() {
	_ = d.pop.Close()
	if d.cancel == nil {
		return
	}
	d.cancel()
	d.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// No longer pushed to (its beat set back past directFresh), its runs
	// still its own until leave.
	if err := directTakeScript.Run(ctx, d.redis, []string{directTakers}, d.id, (directFresh + time.Second).Milliseconds()).Err(); err != nil {
		d.log.Warn("could not leave the direct hand-off; pushes find the worker gone in a few seconds", "error", err)
	}
	for {
		items, err := directDrainScript.Run(ctx, d.redis, []string{directRuns, directTakers}, 64,
			directFresh.Milliseconds()).StringSlice()
		if err != nil {
			d.log.Warn("could not hand the direct hand-off's runs to the queue; the sweeper will", "error", err)
			return
		}
		if len(items) == 0 {
			return
		}
		d.giveBackAll(items)
	}
}

// leave, once the lane is closed, removes the worker from directTakers
// and hands to asynq the runs it took and did not finish (the lane's
// executions that outlasted the shutdown's wait).
func (d *directTaker) leave() {
	if d.cancel == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	items, err := directLeaveScript.Run(ctx, d.redis, []string{directTakers, directTaking + d.id}, d.id).StringSlice()
	if err != nil {
		d.log.Warn("could not leave the direct hand-off; a sweep will, after RUN_LEASE", "error", err)
		return
	}
	// The runs done since the last pop are still listed: not given back.
	d.mu.Lock()
	done := map[string]bool{}
	for _, raw := range d.forgotten {
		done[raw] = true
	}
	d.forgotten = nil
	d.mu.Unlock()
	items = slices.DeleteFunc(items, func(raw string) bool { return done[raw] })
	d.giveBackAll(items)
}

func (d *directTaker) giveBackAll(items []string) {
	for _, raw := range items {
		var it directItem
		if json.Unmarshal([]byte(raw), &it) == nil && it.Run.RunID != "" {
			d.giveBack(it.Run)
		}
	}
}
