package handlers

import "time"

// RateLimitPause is how long a process leaves Redis alone after the start
// rate limit failed open (docs/api.md: "for a second").
const RateLimitPause = rateLimitPause

// RateLimitHoldFor draws how long a refusal is held at RATE_LIMIT_HOLD hold.
func RateLimitHoldFor(hold time.Duration) time.Duration {
	return (&rateLimiter{hold: hold}).holdFor()
}
