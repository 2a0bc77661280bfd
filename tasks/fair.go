package tasks

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// gate admits runs onto the ready list by organisation, so that every tenant
// gets its share of the workers: at most share runs of one organisation
// are in Redis at once (admitted: waiting for a worker, executing or
// retrying), and another organisation's run waits behind at most that many
// of them. An organisation's runs past its share wait their turn in a
// waiting list, in the order they were started, and are admitted as its
// admitted runs finish (release), oldest first. The workers stay
// work-conserving: an organisation alone still fills every slot when its
// share is at least the slots alive (the default share is two to sixteen
// times that, adapted to how long its runs take: gateScript).
//
// Everything lives in Redis, written by one script at a time, so that API
// processes, workers and sweepers agree without a lock: per organisation a
// sorted set of the admitted runs (scored by when they were admitted) and
// one of the waiting runs (scored by when they were started); a hash of the
// waiting runs' hand-off items; the share each organisation was last
// admitted with; and the set of organisations with runs waiting. A waiting
// run is still queued in PostgreSQL, and the sweeper leaves it alone while
// the hash holds it; if Redis loses it, the sweeper hands it on again.
//
// A run admitted but never released (its worker's release did not reach
// Redis) counts against its organisation for at most stale, RUN_TIMEOUT.
type gate struct {
	redis redis.UniversalClient
	// share is ORG_RUN_SHARE: an organisation's share when it has none of
	// its own; 0 means adaptive, 2 to 16 runs per slot alive (gateScript).
	share int
	stale time.Duration
	// servers lists the worker processes alive, for the slots they have.
	servers func() ([]*asynq.ServerInfo, error)

	mu      sync.Mutex
	slots   int
	slotsAt time.Time
}

// The gate's keys share one hash tag; its script also pushes onto the
// hand-off's ready list (handoff.go: one Redis holds every key).
const (
	fairAdmitted = "valruns:{fair}:admitted:" // + org id: sorted set of run ids
	fairWaiting  = "valruns:{fair}:waiting:"  // + org id: sorted set of run ids
	fairPayloads = "valruns:{fair}:payloads"  // run id -> its handoffItem
	fairShares   = "valruns:{fair}:shares"    // org id -> share last admitted with
	fairOrgs     = "valruns:{fair}:orgs"      // org ids with runs waiting
	fairCosts    = "valruns:{fair}:costs"     // org id -> its runs' recent average duration (ms)
)

// shareTargetWait is about how long another organisation's run may wait
// behind one organisation's share, when the share adapts to its runs.
const shareTargetWait = 500 * time.Millisecond

// defaultSlots is the slots assumed while no worker is alive.
const defaultSlots = 10

// gateScript admits up to what an organisation's share leaves free from its
// waiting runs, oldest first, after counting in the runs handed in and
// releasing the runs named, and pushes every run it admits onto the ready
// list. ARGV:
//
//  1. org
//  2. its own share: >= 0 (0: unlimited), -1 none (the default applies),
//     -2 whatever was recorded last (callers that do not know it)
//  3. ORG_RUN_SHARE (> 0: the default share; 0: adaptive, below)
//  4. the worker slots alive
//  5. now, 6. stale (ms)
//  7. how long the released runs took each, on average (ms; -1: none)
//  8. the adaptive share's target wait (ms)
//  9. n, the runs handed in
//  10. n triples (id, score, item); then the released ids
//
// KEYS 7 and 8 are the ready list and asynq's paused flag: while the queue
// is paused, every run waits (a sweep after the resume lets them in).
//
// The adaptive default share is what one slot's worth of the organisation's
// runs, at their recent average duration (an EWMA kept per organisation),
// takes to execute for the target wait: between twice and sixteen times the
// slots alive. Cheap runs get a large share, slow ones a small one (another
// organisation's run waits about the target behind them). Until its first
// runs report how long they took, an organisation gets the smallest share:
// a burst of slow runs started before any ran cannot fill the ready list.
//
// Each redis.call costs about a microsecond of Redis's one thread, so the
// common calls make few: a release with nothing waiting only forgets its
// runs and keeps the cost; the stale admitted runs are pruned only when
// they would keep a run out.
//
// Returns the runs admitted (pushed), of those handed in (a redelivery of a
// run admitted before keeps its place) and of the waiting ones.
var gateScript = redis.NewScript(`
local adm, wait, pay, shares, orgs, costs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local org, own = ARGV[1], tonumber(ARGV[2])
local fixed, slots, now, stale = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local sample, target, n = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
for i = 10 + 3 * n, #ARGV do
  redis.call('ZREM', adm, ARGV[i])
end
local cost
if sample >= 0 then
  cost = tonumber(redis.call('HGET', costs, org) or '0')
  if cost <= 0 then cost = sample else cost = 0.8 * cost + 0.2 * sample end
  redis.call('HSET', costs, org, tostring(cost))
end
if own == -2 then
  if n == 0 and redis.call('ZCARD', wait) == 0 then
    redis.call('SREM', orgs, org)
    return {}
  end
  own = tonumber(redis.call('HGET', shares, org) or '-1')
else
  redis.call('HSET', shares, org, own)
end
local share = own
if share < 0 then
  if fixed > 0 then
    share = fixed
  else
    cost = cost or tonumber(redis.call('HGET', costs, org) or '0')
    share = 2 * slots
    if cost > 0 then share = math.floor(target * slots / cost) end
    share = math.max(2 * slots, math.min(16 * slots, share))
  end
end
local pruned = false
-- room is what the share leaves free for want runs; the stale admitted
-- runs are pruned once, when they would keep one out.
local function room(want)
  if share == 0 then return want end
  local r = share - redis.call('ZCARD', adm)
  if r < want and not pruned then
    pruned = true
    redis.call('ZREMRANGEBYSCORE', adm, '-inf', now - stale)
    r = share - redis.call('ZCARD', adm)
  end
  return r
end
local paused = redis.call('EXISTS', KEYS[8]) == 1
local out = {}
local function admit(id, item)
  redis.call('ZADD', adm, now, id)
  redis.call('RPUSH', KEYS[7], item)
  out[#out + 1] = id
end
if n > 0 and not paused and redis.call('ZCARD', wait) == 0 and room(n) >= n then
  for i = 0, n - 1 do
    admit(ARGV[10 + 3 * i], ARGV[12 + 3 * i])
  end
  return out
end
for i = 0, n - 1 do
  local id = ARGV[10 + 3 * i]
  if not paused and redis.call('ZSCORE', adm, id) then
    admit(id, ARGV[12 + 3 * i]) -- admitted before (a redelivery): it keeps its place
  else
    redis.call('ZREM', adm, id)
    redis.call('ZADD', wait, ARGV[11 + 3 * i], id)
    redis.call('HSET', pay, id, ARGV[12 + 3 * i])
  end
end
local free = 0
if not paused then
  free = redis.call('ZCARD', wait)
  free = math.min(free, room(free))
end
if free > 0 then
  for _, id in ipairs(redis.call('ZRANGE', wait, 0, free - 1)) do
    local item = redis.call('HGET', pay, id) or cjson.encode({run = {run_id = id, org_id = org}})
    redis.call('ZREM', wait, id)
    redis.call('HDEL', pay, id)
    admit(id, item)
  end
end
if redis.call('ZCARD', wait) == 0 then
  redis.call('SREM', orgs, org)
else
  redis.call('SADD', orgs, org)
end
return out
`)

// admission is one organisation's call of gateScript.
type admission struct {
	org string
	// own is the organisation's own share, if any (the dispatcher's, from
	// its principal); recorded: the caller does not know it (the worker,
	// the sweeper), so the one recorded last applies.
	own      *int
	recorded bool
	in       []RunPayload
	// items are in's hand-off items (JSON), one per run.
	items [][]byte
	// released: runs of org that left the queue, and how long they took
	// each on average (cost; 0: unknown).
	released []string
	cost     time.Duration
}

// passed is what the gate did with an admission.
type passed struct {
	// admitted lists the runs it pushed onto ready: of those handed in,
	// and of those let in from the waiting list.
	admitted []string
}

// pass runs a through the gate.
func (g *gate) pass(ctx context.Context, a admission) (passed, error) {
	own := -1
	switch {
	case a.recorded:
		own = -2
	case a.own != nil:
		own = *a.own
	}
	sample := -1.0
	if a.cost > 0 {
		sample = float64(a.cost) / float64(time.Millisecond)
	}
	args := make([]any, 0, 9+3*len(a.in)+len(a.released))
	args = append(args, a.org, own, g.share, g.slotsAlive(), time.Now().UnixMilli(), g.stale.Milliseconds(),
		sample, shareTargetWait.Milliseconds(), len(a.in))
	for i, p := range a.in {
		args = append(args, p.RunID, p.CreatedAt.UnixMicro(), a.items[i])
	}
	for _, id := range a.released {
		args = append(args, id)
	}
	keys := []string{fairAdmitted + a.org, fairWaiting + a.org, fairPayloads, fairShares, fairOrgs, fairCosts,
		readyList, queuePaused}
	ids, err := gateScript.Run(ctx, g.redis, keys, args...).StringSlice()
	if err != nil {
		return passed{}, fmt.Errorf("admit runs: %w", err)
	}
	return passed{admitted: ids}, nil
}

// waiting counts the runs waiting at the gate, all organisations: one per
// payload held.
func (g *gate) waiting(ctx context.Context) (int64, error) {
	n, err := g.redis.HLen(ctx, fairPayloads).Result()
	if err != nil {
		return 0, fmt.Errorf("count the runs waiting at the gate: %w", err)
	}
	return n, nil
}

// admitted lists the runs of org the gate counts in the queue.
func (g *gate) admitted(ctx context.Context, org string) ([]string, error) {
	ids, err := g.redis.ZRange(ctx, fairAdmitted+org, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("list an organisation's admitted runs: %w", err)
	}
	return ids, nil
}

// slotsAlive is how many runs the workers alive execute at once (read at
// most every few seconds; defaultSlots while none is known).
func (g *gate) slotsAlive() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.servers != nil && time.Since(g.slotsAt) > 5*time.Second {
		g.slotsAt = time.Now()
		if servers, err := g.servers(); err == nil {
			n := 0
			for _, s := range servers {
				if _, ok := s.Queues[queue]; ok {
					n += s.Concurrency
				}
			}
			g.slots = n
		}
	}
	if g.slots <= 0 {
		return defaultSlots
	}
	return g.slots
}
