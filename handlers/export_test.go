package handlers

// RateLimitPause is how long a process leaves Redis alone after the start
// rate limit failed open (docs/api.md: "for a second").
const RateLimitPause = rateLimitPause
