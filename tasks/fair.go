package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// gate admits runs into the queue by organisation, so that every tenant
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
// waiting runs' task payloads; the share each organisation was last
// admitted with; and the set of organisations with runs waiting. A waiting
// run is still queued in PostgreSQL, and the sweeper leaves it alone while
// the hash holds it; if Redis loses it, the sweeper enqueues it again.
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
// direct hand-off's list (direct.go: one Redis holds every key).
const (
	fairAdmitted = "valruns:{fair}:admitted:" // + org id: sorted set of run ids
	fairWaiting  = "valruns:{fair}:waiting:"  // + org id: sorted set of run ids
	fairPayloads = "valruns:{fair}:payloads"  // run id -> RunPayload
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
// releasing the runs named. ARGV:
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
//  10. the direct hand-off's runs per worker taking (directPerTaker; 0:
//     push none), 11. how recent a worker's beat must be (ms, directFresh)
//  12. n triples (id, score, payload); then, when ARGV[10] > 0, n items
//     for the direct hand-off's list, one per run; then the released ids
//
// KEYS 7 to 9 are the direct hand-off's list, its workers taking and
// asynq's paused flag: when every run handed in is admitted at once, the
// same call pushes their items onto the list as far as a worker waits
// (direct_push), so that a new run reaches an idle worker in one round
// trip from the API.
//
// The adaptive default share is what one slot's worth of the organisation's
// runs, at their recent average duration (an EWMA kept per organisation),
// takes to execute for the target wait: between twice and sixteen times the
// slots alive. Cheap runs get a large share (batches: the queue's overhead
// spread over many runs), slow ones a small one (another organisation's run
// waits about the target behind them).
//
// Returns {1, share, pushed} when every run handed in was admitted at once
// (nothing was waiting): pushed is how many of them, from the first, went
// onto the direct hand-off's list (-1: no worker takes, or the queue is
// paused); else {0, share, id, payload, ...}: the runs handed in that
// were admitted already (redeliveries), and those admitted from the
// waiting list, which the caller enqueues.
var gateScript = redis.NewScript(directPushLua + `
local adm, wait, pay, shares, orgs, costs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local org, own = ARGV[1], tonumber(ARGV[2])
local fixed, slots, now, stale = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local sample, target, n = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local per, fresh = tonumber(ARGV[10]), tonumber(ARGV[11])
local items = 12 + 3 * n
local released = items
if per > 0 then released = items + n end
if own == -2 then
  own = tonumber(redis.call('HGET', shares, org) or '-1')
else
  redis.call('HSET', shares, org, own)
end
local cost = tonumber(redis.call('HGET', costs, org) or '0')
if sample >= 0 then
  if cost <= 0 then cost = sample else cost = 0.8 * cost + 0.2 * sample end
  redis.call('HSET', costs, org, tostring(cost))
end
local share = own
if share < 0 then
  if fixed > 0 then
    share = fixed
  else
    share = 16 * slots
    if cost > 0 then share = math.floor(target * slots / cost) end
    share = math.max(2 * slots, math.min(16 * slots, share))
  end
end
redis.call('ZREMRANGEBYSCORE', adm, '-inf', now - stale)
for i = released, #ARGV do
  redis.call('ZREM', adm, ARGV[i])
end
if n > 0 and redis.call('ZCARD', wait) == 0 and (share == 0 or share - redis.call('ZCARD', adm) >= n) then
  for i = 0, n - 1 do
    redis.call('ZADD', adm, now, ARGV[12 + 3 * i])
  end
  local pushed = 0
  if per > 0 then
    pushed = direct_push(KEYS[7], KEYS[8], KEYS[9], per, fresh, items, items + n - 1)
  end
  return {1, share, pushed}
end
local out = {0, share}
for i = 0, n - 1 do
  local id = ARGV[12 + 3 * i]
  if redis.call('ZSCORE', adm, id) then
    -- Admitted before (a redelivery: its task was lost): it keeps its
    -- place, and its new task goes to the queue now.
    redis.call('ZADD', adm, now, id)
    out[#out + 1] = id
    out[#out + 1] = ARGV[14 + 3 * i]
  else
    redis.call('ZADD', wait, ARGV[13 + 3 * i], id)
    redis.call('HSET', pay, id, ARGV[14 + 3 * i])
  end
end
local free = redis.call('ZCARD', wait)
if share > 0 then
  free = math.min(free, share - redis.call('ZCARD', adm))
end
if free > 0 then
  local ids = redis.call('ZRANGE', wait, 0, free - 1)
  for _, id in ipairs(ids) do
    redis.call('ZADD', adm, now, id)
    redis.call('ZREM', wait, id)
    out[#out + 1] = id
    out[#out + 1] = redis.call('HGET', pay, id) or ''
    redis.call('HDEL', pay, id)
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
	// released: runs of org that left the queue, and how long they took
	// each on average (cost; 0: unknown).
	released []string
	cost     time.Duration
	// push, when set, holds one item of the direct hand-off per run of
	// in: pushed onto its list in the same call when all of in are let in
	// at once and a worker waits (gateScript).
	push [][]byte
	// raw, when set, is in's payloads as JSON, one per run (admit marshals
	// them once for the gate's triples and the direct items).
	raw [][]byte
}

// passed is what the gate did with an admission.
type passed struct {
	// out is the runs to enqueue now: the admission's in when all were let
	// in at once, else those let in from the waiting list (which may
	// include some of in).
	out   []RunPayload
	share int
	// pushed is how many of out, from the first, are on the direct
	// hand-off's list; notTaken: the admission pushed none because no
	// worker takes or the queue is paused; notPushed: it did not ask.
	pushed int
}

const (
	notTaken  = -1
	notPushed = -2
)

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
	per := 0
	if a.push != nil {
		per = directPerTaker
	}
	args := make([]any, 0, 11+3*len(a.in)+len(a.push)+len(a.released))
	args = append(args, a.org, own, g.share, g.slotsAlive(), time.Now().UnixMilli(), g.stale.Milliseconds(),
		sample, shareTargetWait.Milliseconds(), len(a.in), per, directFresh.Milliseconds())
	raw := a.raw
	if len(raw) != len(a.in) {
		var err error
		if raw, err = payloadsJSON(a.in); err != nil {
			return passed{}, err
		}
	}
	for i, p := range a.in {
		args = append(args, p.RunID, p.CreatedAt.UnixMicro(), raw[i])
	}
	for _, it := range a.push {
		args = append(args, it)
	}
	for _, id := range a.released {
		args = append(args, id)
	}
	keys := []string{fairAdmitted + a.org, fairWaiting + a.org, fairPayloads, fairShares, fairOrgs, fairCosts,
		directRuns, directTakers, queuePaused}
	res, err := gateScript.Run(ctx, g.redis, keys, args...).Slice()
	if err != nil {
		return passed{}, fmt.Errorf("admit runs: %w", err)
	}
	if len(res) < 2 {
		return passed{}, fmt.Errorf("admit runs: unexpected answer %v", res)
	}
	share, _ := res[1].(int64)
	if res[0] == int64(1) {
		pushed := int64(notPushed)
		if per > 0 && len(res) > 2 {
			pushed, _ = res[2].(int64)
		}
		return passed{out: a.in, share: int(share), pushed: int(pushed)}, nil
	}
	var out []RunPayload
	for i := 2; i+1 < len(res); i += 2 {
		id, _ := res[i].(string)
		raw, _ := res[i+1].(string)
		var p RunPayload
		if raw == "" || json.Unmarshal([]byte(raw), &p) != nil || p.RunID != id {
			p = RunPayload{RunID: id, OrgID: a.org} // the worker reads it back
		}
		out = append(out, p)
	}
	return passed{out: out, share: int(share), pushed: notPushed}, nil
}

// waitingOrgs lists the organisations with runs waiting.
func (g *gate) waitingOrgs(ctx context.Context) ([]string, error) {
	orgs, err := g.redis.SMembers(ctx, fairOrgs).Result()
	if err != nil {
		return nil, fmt.Errorf("list organisations with runs waiting: %w", err)
	}
	return orgs, nil
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

// batchSize is the most runs of one organisation one task carries: its
// share spread over the slots alive, so that its admitted runs occupy every
// slot rather than wait in one task behind each other.
func (g *gate) batchSize(share int) int {
	if share <= 0 {
		return batchMax
	}
	return min(max(share/g.slotsAlive(), 1), batchMax)
}
