// Package reliability is valruns's process-level fault suite, and nothing
// else: its code is all in _test.go files. It exists because the promises of
// docs/api.md that matter most in production (exactly one run per key, every
// accepted run reaches a final state, a 5xx only when the client should
// retry, never another tenant's data) are about processes, networks and
// crashes, which no in-process test can reach.
//
// The suite builds the real binary and runs, per scenario, two `valruns
// serve` replicas and two `valruns worker`s against a private PostgreSQL and
// a private Redis that it starts itself (never the system ones), so it can
// kill and restart any of them. Clients retry as real clients do (one
// Idempotency-Key per logical operation, exponential backoff with jitter),
// and after each scenario the database is checked: one run per key, usage
// equal to runs, every run final, findings written once.
//
// Run it with `make reliability`; its README.md explains each scenario and
// keeps the figures of real runs.
package reliability
