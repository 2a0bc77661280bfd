package tasks

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// RunsEndedChannel is the Redis channel a worker publishes on as it ends
// runs, so that the API processes' long-polls (GET /api/runs/{id}/ with
// Prefer: wait) look at once rather than at their next tick. The message
// carries nothing: a long-poll asks PostgreSQL which of its runs are final,
// so a message lost or late only delays an answer until that tick.
const RunsEndedChannel = "valruns:runs:ended"

// endedGap is the least time between two of a worker's messages: a stream
// of ending runs costs at most one PUBLISH per gap.
const endedGap = 2 * time.Millisecond

// endedNotice tells, at most every endedGap, that runs ended, on Redis
// (RunsEndedChannel); an API in the same process (serve --worker) hears it
// there too.
type endedNotice struct {
	redis redis.UniversalClient
	due   chan struct{}
}

func newEndedNotice(rc redis.UniversalClient) *endedNotice {
	return &endedNotice{redis: rc, due: make(chan struct{}, 1)}
}

// ended marks that a run ended; it never blocks.
func (n *endedNotice) ended() { signal(n.due) }

// signal puts a mark in ch (a buffer of one) unless one is there already:
// many signals before the reader looks are one.
func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// run sends the notices until ctx ends.
func (n *endedNotice) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.due:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_ = n.redis.Publish(pctx, RunsEndedChannel, "").Err() // lost: the long-polls' tick answers
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-time.After(endedGap):
		}
	}
}

// WatchRunsEnded subscribes to RunsEndedChannel until ctx ends, and
// marks the channel it returns at each message, messages not read yet
// counting as one (the API's long-poll: handlers.Deps.RunsEnded). While
// Redis is unreachable it marks nothing, and the long-polls answer at
// their tick.
func WatchRunsEnded(ctx context.Context, rc redis.UniversalClient) <-chan struct{} {
	ended := make(chan struct{}, 1)
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
			case _, ok := <-msgs:
				if !ok {
					return
				}
				signal(ended)
			}
		}
	}()
	return ended
}
