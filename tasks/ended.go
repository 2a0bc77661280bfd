package tasks

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RunsEndedChannel is the Redis channel a worker publishes on as it ends
// runs, so that the API processes' long-polls (GET /api/runs/{id}/ with
// Prefer: wait) answer at once rather than at their next tick. A message
// names the runs that ended, comma-separated, each after its final commit;
// an empty one (more ended than a message names, or an older worker) says
// only that runs ended, and a long-poll then asks PostgreSQL which of its
// runs are final. A message lost or late only delays an answer until that
// tick.
const RunsEndedChannel = "valruns:runs:ended"

// endedMaxIDs is the most runs one message names.
const endedMaxIDs = 256

// endedNotice tells, on Redis (RunsEndedChannel), which runs ended: one
// message at a time, naming every run that ended since the last (an API in
// the same process, serve --worker, hears it there too).
type endedNotice struct {
	redis redis.UniversalClient
	due   chan struct{}

	mu   sync.Mutex
	ids  []string // ended since the last message
	many bool     // more than endedMaxIDs ended since then
}

func newEndedNotice(rc redis.UniversalClient) *endedNotice {
	return &endedNotice{redis: rc, due: make(chan struct{}, 1)}
}

// ended marks that run ended; it never blocks.
func (n *endedNotice) ended(run string) {
	n.mu.Lock()
	if len(n.ids) < endedMaxIDs {
		n.ids = append(n.ids, run)
	} else {
		n.many = true
	}
	n.mu.Unlock()
	signal(n.due)
}

// take is the message due, if any: the runs ended since the last, or ""
// when more ended than it names.
func (n *endedNotice) take() (msg string, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.ids) == 0 {
		return "", false
	}
	if !n.many {
		msg = strings.Join(n.ids, ",")
	}
	n.ids, n.many = nil, false
	return msg, true
}

// signal puts a mark in ch (a buffer of one) unless one is there already:
// many signals before the reader looks are one.
func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// run sends the messages until ctx ends: what ends while one is sent goes
// in the next.
func (n *endedNotice) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.due:
		}
		if msg, ok := n.take(); ok {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			_ = n.redis.Publish(pctx, RunsEndedChannel, msg).Err() // lost: the long-polls' tick answers
			cancel()
		}
	}
}

// WatchRunsEnded subscribes to RunsEndedChannel until ctx ends, and passes
// on what each message says on the channel it returns: the runs it names,
// or nil (runs ended: look). A message not read yet is merged with the next
// (nil if either is, or if they name more than endedMaxIDs together), so
// the watcher never blocks and holds at most one. While Redis is
// unreachable it passes nothing, and the long-polls answer at their tick
// (the API's long-poll: handlers.Deps.RunsEnded).
func WatchRunsEnded(ctx context.Context, rc redis.UniversalClient) <-chan []string {
	ended := make(chan []string, 1)
	sub := rc.Subscribe(ctx, RunsEndedChannel)
	go func() {
		defer sub.Close()
		// A ping a minute keeps an idle subscription checked without
		// costing Redis (go-redis pings every 3 s by default).
		msgs := sub.Channel(redis.WithChannelHealthCheckInterval(time.Minute))
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-msgs:
				if !ok {
					return
				}
				var ids []string
				if m.Payload != "" {
					ids = strings.Split(m.Payload, ",")
				}
				pass(ended, ids)
			}
		}
	}()
	return ended
}

// pass puts ids in ended without blocking, merged with what is there.
func pass(ended chan []string, ids []string) {
	for {
		select {
		case ended <- ids:
			return
		default:
		}
		select {
		case old := <-ended:
			if old == nil || ids == nil || len(old)+len(ids) > endedMaxIDs {
				ids = nil
			} else {
				ids = append(old, ids...)
			}
		default:
		}
	}
}
