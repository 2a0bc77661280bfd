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
// share is at least the slots alive (the default share is twice that).
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
	// its own; 0 means twice the worker slots alive.
	share int
	stale time.Duration
	// servers lists the worker processes alive, for the slots they have.
	servers func() ([]*asynq.ServerInfo, error)

	mu      sync.Mutex
	slots   int
	slotsAt time.Time
}

// The gate's keys share one hash tag: one slot of a Redis Cluster.
const (
	fairAdmitted = "valruns:{fair}:admitted:" // + org id: sorted set of run ids
	fairWaiting  = "valruns:{fair}:waiting:"  // + org id: sorted set of run ids
	fairPayloads = "valruns:{fair}:payloads"  // run id -> RunPayload
	fairShares   = "valruns:{fair}:shares"    // org id -> share last admitted with
	fairOrgs     = "valruns:{fair}:orgs"      // org ids with runs waiting
)

// defaultSlots is the slots assumed while no worker is alive.
const defaultSlots = 10

// gateScript admits up to what an organisation's share leaves free from its
// waiting runs, oldest first, after counting in the runs handed in
// (ARGV[6]..: id, score, payload) and releasing the runs named
// (ARGV[7+3n]..). ARGV: org, share (-1: the one last recorded, else
// ARGV[3]), default share, now (ms), stale (ms), n handed in, then the
// triples, then the released ids. Returns {1} when every run handed in was
// admitted at once (nothing was waiting), else {0, share, id, payload, ...}:
// the share applied and the runs admitted from the waiting list, which the
// caller enqueues.
var gateScript = redis.NewScript(`
local adm, wait, pay, shares, orgs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local org, share, now, stale, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if share < 0 then
  share = tonumber(redis.call('HGET', shares, org) or ARGV[3])
else
  redis.call('HSET', shares, org, share)
end
redis.call('ZREMRANGEBYSCORE', adm, '-inf', now - stale)
for i = 7 + 3 * n, #ARGV do
  redis.call('ZREM', adm, ARGV[i])
end
if n > 0 and redis.call('ZCARD', wait) == 0 and (share == 0 or share - redis.call('ZCARD', adm) >= n) then
  for i = 0, n - 1 do
    redis.call('ZADD', adm, now, ARGV[7 + 3 * i])
  end
  return {1}
end
for i = 0, n - 1 do
  local id = ARGV[7 + 3 * i]
  if redis.call('ZSCORE', adm, id) then
    redis.call('ZADD', adm, now, id) -- admitted before (a redelivery): stays admitted
  else
    redis.call('ZADD', wait, ARGV[8 + 3 * i], id)
    redis.call('HSET', pay, id, ARGV[9 + 3 * i])
  end
end
local free = redis.call('ZCARD', wait)
if share > 0 then
  free = math.min(free, share - redis.call('ZCARD', adm))
end
local out = {0, share}
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
	// share: the organisation's own (nil: the default; -1: the one last
	// recorded, for callers that do not know it).
	share *int
	in    []RunPayload
	// released: runs of org that left the queue.
	released []string
}

// pass runs a, and returns the runs to enqueue now: a.in when all were
// admitted at once, else those admitted from the waiting list (which may
// include some of a.in); and the organisation's share.
func (g *gate) pass(ctx context.Context, a admission) ([]RunPayload, int, error) {
	share := -1
	if a.share != nil {
		share = *a.share
	}
	args := make([]any, 0, 6+3*len(a.in)+len(a.released))
	args = append(args, a.org, share, g.defaultShare(), time.Now().UnixMilli(), g.stale.Milliseconds(), len(a.in))
	for _, p := range a.in {
		b, err := json.Marshal(p)
		if err != nil {
			return nil, 0, fmt.Errorf("run payload: %w", err)
		}
		args = append(args, p.RunID, p.CreatedAt.UnixMicro(), b)
	}
	for _, id := range a.released {
		args = append(args, id)
	}
	keys := []string{fairAdmitted + a.org, fairWaiting + a.org, fairPayloads, fairShares, fairOrgs}
	res, err := gateScript.Run(ctx, g.redis, keys, args...).Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("admit runs: %w", err)
	}
	if len(res) == 1 && res[0] == int64(1) {
		return a.in, share, nil
	}
	if len(res) < 2 {
		return nil, 0, fmt.Errorf("admit runs: unexpected answer %v", res)
	}
	applied, _ := res[1].(int64)
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
	return out, int(applied), nil
}

// waitingOrgs lists the organisations with runs waiting.
func (g *gate) waitingOrgs(ctx context.Context) ([]string, error) {
	orgs, err := g.redis.SMembers(ctx, fairOrgs).Result()
	if err != nil {
		return nil, fmt.Errorf("list organisations with runs waiting: %w", err)
	}
	return orgs, nil
}

// defaultShare is ORG_RUN_SHARE, or twice the worker slots alive.
func (g *gate) defaultShare() int {
	if g.share > 0 {
		return g.share
	}
	return 2 * g.slotsAlive()
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

// shareOf resolves a run's share as the dispatcher admits it.
func (g *gate) shareOf(own *int) int {
	if own != nil {
		return *own
	}
	return g.defaultShare()
}
