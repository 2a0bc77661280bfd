package handlers

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RateLimitPause is how long a process leaves Redis alone after the start
// rate limit failed open (docs/api.md: "for a second").
const RateLimitPause = rateLimitPause

// RateLimitHoldFor draws how long a refusal is held at RATE_LIMIT_HOLD hold.
func RateLimitHoldFor(hold time.Duration) time.Duration {
	return (&rateLimiter{hold: hold}).holdFor()
}

// MaxListItemBytes bounds one item of any list answer once encoded: every
// field of an item is an id, a time, a number, a value of a closed set, or
// a string the database bounds (a workflow's name: 200 characters; a run's
// error: 2000; an endpoint's URL: 2048 and description: 500; a delivery's
// last error: 1000), at most 6 bytes per character once JSON-escaped. With
// at most 100 items a page, a list answer is at most 1.6 MiB whatever the
// tenant stored (docs/api.md, Limits).
const MaxListItemBytes = 16 << 10

// RunWaits is the long-poll's hub, for the tests of its mechanism.
type RunWaits struct{ h *runWaits }

// NewRunWaits is a hub asking finished which runs are final, whose tick is
// every (a test of the signals sets one longer than any wait) and which
// hears ended as the workers' channel.
func NewRunWaits(finished func(context.Context, []string) ([]string, error), every time.Duration, ended <-chan []string) RunWaits {
	h := newRunWaits(finished, 100, make(chan struct{}), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	h.every, h.ended = every, ended
	return RunWaits{h}
}

// Wait joins the waiters of run and waits up to d: the outcome (final,
// timeout), or "" when the hub refused the join.
func (x RunWaits) Wait(org, run string, d time.Duration) string {
	w := x.h.join(org, run)
	if w == nil {
		return ""
	}
	return x.h.wait(context.Background(), w, d)
}

// Waiting is how many requests wait.
func (x RunWaits) Waiting() int { return x.h.waiting() }
