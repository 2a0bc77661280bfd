package handlers

import "time"

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
