// Package config holds every setting of valruns, read once from environment
// variables with working local defaults and validated before anything starts.
// A bad value is an error that names the variable, so start-up can stop with
// one readable line.
package config

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Config is the whole configuration. The zero value is not usable: build it
// with Load, which fills the defaults.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string (DATABASE_URL).
	DatabaseURL string
	// DatabaseDirectURL reaches PostgreSQL itself, not through a pooler in
	// transaction mode, for what needs a session of its own: the
	// migrations' advisory lock. Load sets it to DatabaseURL when unset
	// (DATABASE_DIRECT_URL).
	DatabaseDirectURL string
	// DatabasePooler says what DatabaseURL reaches: "none" (PostgreSQL, or
	// a pooler in session mode) or "transaction" (a pooler in transaction
	// mode, such as PgBouncer's pool_mode=transaction): then no statement
	// relies on a session, prepared statements included (DATABASE_POOLER).
	DatabasePooler string
	// DatabaseMaxConns caps each process's connections to PostgreSQL
	// (DATABASE_MAX_CONNS).
	DatabaseMaxConns int
	// DatabaseAcquireTimeout bounds how long a request waits for a database
	// connection, connecting included; past it the answer is 503
	// service_unavailable (DATABASE_ACQUIRE_TIMEOUT).
	DatabaseAcquireTimeout time.Duration
	// DatabaseAnswerTimeout bounds how long a request waits for the
	// database's answer to its first statement; past it the answer is 503
	// service_unavailable, so a hung database does not hang requests
	// (DATABASE_ANSWER_TIMEOUT).
	DatabaseAnswerTimeout time.Duration
	// RedisURL is the Redis connection string used by asynq (REDIS_URL):
	// redis://, rediss:// or redis-sentinel:// (tasks.ParseRedisURL).
	RedisURL string
	// HTTPAddr is the listen address of `valruns serve` (HTTP_ADDR).
	HTTPAddr string
	// IdempotencyTTL is how long a stored idempotent response is replayed
	// (IDEMPOTENCY_TTL), at most MaxIdempotencyTTL.
	IdempotencyTTL time.Duration
	// IdempotencyTxTimeout is the request transaction's own deadline; the
	// transaction ignores client hang-ups, so this is what bounds it (IDEMPOTENCY_TX_TIMEOUT).
	IdempotencyTxTimeout time.Duration
	// IdempotencyKeyRequired makes the Idempotency-Key header mandatory on
	// idempotent routes (IDEMPOTENCY_KEY_REQUIRED).
	IdempotencyKeyRequired bool
	// WebhookAllowPrivateTargets lets webhook endpoints point at loopback,
	// private, link-local and metadata addresses (WEBHOOK_ALLOW_PRIVATE_TARGETS);
	// for local development and tests only.
	WebhookAllowPrivateTargets bool
	// WebhookConcurrency is how many webhook attempts one worker makes at
	// once; 0: this worker sends none (WEBHOOK_CONCURRENCY).
	WebhookConcurrency int
	// WebhookPollInterval is how often a worker looks for webhook
	// deliveries due (WEBHOOK_POLL_INTERVAL).
	WebhookPollInterval time.Duration
	// WebhookRetryBase is the delay after a delivery's first failed
	// attempt, four times longer after each further one (WEBHOOK_RETRY_BASE).
	WebhookRetryBase time.Duration
	// WebhookRetryHorizon is how long a delivery is retried before it
	// fails for good (WEBHOOK_RETRY_HORIZON).
	WebhookRetryHorizon time.Duration
	// WebhookDeliveryRetention is how long a delivery delivered or failed
	// is kept before the cleanup deletes it (WEBHOOK_DELIVERY_RETENTION).
	WebhookDeliveryRetention time.Duration
	// WebhookClaimLease is how long a worker's claim of a delivery holds it
	// for one attempt; an attempt that has not recorded its outcome by then
	// (its worker died, the write failed) lets the delivery be claimed and
	// attempted again (WEBHOOK_CLAIM_LEASE).
	WebhookClaimLease time.Duration
	// IdempotencyMaxWait caps how long a request with `Prefer: wait=N` waits
	// for the in-flight request with its key; 0 disables waiting (IDEMPOTENCY_MAX_WAIT).
	IdempotencyMaxWait time.Duration
	// IdempotencyMaxWaiters caps the requests waiting at once per API
	// process; past it the answer is 409 at once. An organisation holds at
	// most a quarter of them, and one with no request waiting always gets
	// one (IDEMPOTENCY_MAX_WAITERS).
	IdempotencyMaxWaiters int
	// DefaultMonthlyRunQuota is the number of runs an organisation may start
	// per calendar month (UTC) unless it has its own quota; 0 means unlimited
	// (DEFAULT_MONTHLY_RUN_QUOTA).
	DefaultMonthlyRunQuota int64
	// OrgStartRate is how many starts per second an organisation may make,
	// across all API processes, unless it has its own rate; 0 means
	// unlimited (ORG_START_RATE).
	OrgStartRate int
	// RateLimitHold is how long a start refused by the rate limit is held
	// at least (up to twice it, at random) before its 429 is sent, so that a client retrying at once, whatever
	// Retry-After says, cannot take the CPU the other organisations need;
	// 0 answers at once (RATE_LIMIT_HOLD).
	RateLimitHold time.Duration
	// OrgRunShare is how many of an organisation's runs may wait in the
	// queue at once, unless it has its own share; the rest wait their turn
	// in order. 0 means adaptive: what its recent runs take about 0.5 s to
	// execute on the slots alive, 2 to 16 runs per slot (ORG_RUN_SHARE).
	OrgRunShare int
	// CleanupSchedule is the asynq cron spec of the expired-key cleanup (CLEANUP_SCHEDULE).
	CleanupSchedule string
	// CleanupBatchSize is how many webhook deliveries one cleanup transaction deletes (CLEANUP_BATCH_SIZE).
	CleanupBatchSize int
	// MaxBodyBytes caps request bodies; larger ones answer 413 (MAX_BODY_BYTES).
	MaxBodyBytes int64
	// MaxRequestsInFlight caps the /api/ requests one API process serves at
	// once; past it a request waits up to OverloadWait, then answers 503
	// overloaded. 0 means unlimited (MAX_REQUESTS_IN_FLIGHT).
	MaxRequestsInFlight int
	// MaxBodyBytesInFlight caps the request bodies one API process holds at
	// once, each counted by its Content-Length (MaxBodyBytes when unknown);
	// past it a request waits up to OverloadWait, then answers 503
	// overloaded. 0 means unlimited; otherwise at least MaxBodyBytes; unset,
	// 8 x MaxBodyBytes (MAX_BODY_BYTES_IN_FLIGHT).
	MaxBodyBytesInFlight int64
	// OverloadWait is the longest a request waits for room under
	// MaxRequestsInFlight and MaxBodyBytesInFlight; 0 answers 503 at once
	// (OVERLOAD_WAIT).
	OverloadWait time.Duration
	// LogLevel is debug, info, warn or error (LOG_LEVEL).
	LogLevel string
	// LogFormat is text or json (LOG_FORMAT).
	LogFormat string
	// MigrateOnStart makes `serve` apply pending migrations instead of refusing to start (MIGRATE_ON_START).
	MigrateOnStart bool
	// AuthCacheTTL is how long a verified API token is trusted without asking
	// the database again; 0 disables the cache (AUTH_CACHE_TTL).
	AuthCacheTTL time.Duration
	// ShutdownTimeout bounds the graceful shutdown of serve and worker (SHUTDOWN_TIMEOUT).
	ShutdownTimeout time.Duration
	// ShutdownDrain is how long `serve` keeps serving after SIGTERM or
	// SIGINT, its /readyz answering 503, before it stops accepting requests:
	// time for a load balancer to see it leave. 0 stops at once (SHUTDOWN_DRAIN).
	ShutdownDrain time.Duration
	// WorkerConcurrency is how many runs one worker process executes at once (WORKER_CONCURRENCY).
	WorkerConcurrency int
	// RunLease is how long a claim or a heartbeat holds a running run; a run
	// whose worker died is taken over once its lease runs out (RUN_LEASE).
	RunLease time.Duration
	// RunHeartbeat is how often a worker renews the lease of a run it is
	// executing; shorter than RunLease. RUN_HEARTBEAT=0 means RunLease/3,
	// which is what Load stores here (RUN_HEARTBEAT).
	RunHeartbeat time.Duration
	// RunMaxRetry is how often a failing run task is retried before the run
	// ends in error (RUN_MAX_RETRY).
	RunMaxRetry int
	// RunRetryDelay is the delay before a failing run task's first retry,
	// doubled per retry up to a minute; a transient database error is retried
	// after about this long without spending a retry (RUN_RETRY_DELAY).
	RunRetryDelay time.Duration
	// RunTimeout bounds one execution of a run, behind the validation
	// engine's own limits; a run past it ends in error (RUN_TIMEOUT).
	RunTimeout time.Duration
	// RunSweepInterval is how often each worker looks for stranded runs
	// (RUN_SWEEP_INTERVAL).
	RunSweepInterval time.Duration
	// RunPollInterval is how often a worker's asynq server looks for
	// retries due and the cleanup (RUN_POLL_INTERVAL).
	RunPollInterval time.Duration
	// RunRedeliverAfter is how long a run may stay queued before the sweeper
	// checks that its task is still in Redis, and how long before it looks at
	// the same run again (RUN_REDELIVER_AFTER).
	RunRedeliverAfter time.Duration
	// RunMaxWait caps how long `GET /api/runs/{id}/` with `Prefer: wait=N`
	// waits for the run to become final; 0 disables waiting: the run is
	// answered at once (RUN_MAX_WAIT).
	RunMaxWait time.Duration
	// RunMaxWaiters caps the run reads waiting at once (`Prefer: wait`) per
	// API process; past it a read is answered at once, the preference
	// ignored (RUN_MAX_WAITERS).
	RunMaxWaiters int
	// RunFastPath is how long a run's first delivery may validate it
	// without claiming it, writing it once from queued to final; past it
	// the run is claimed and validated under a lease. 0: every run is
	// claimed first (RUN_FAST_PATH).
	RunFastPath time.Duration
	// WorkerMetricsAddr is where `valruns worker` serves /metrics, /healthz and /readyz (WORKER_METRICS_ADDR).
	WorkerMetricsAddr string
	// PprofAddr, when set, is where serve and worker serve net/http/pprof;
	// "" (the default) serves nothing (PPROF_ADDR).
	PprofAddr string
}

// Var describes one environment variable: its name, default and meaning.
// The configuration table of docs/operations.md is this list.
type Var struct {
	Name, Default, Doc string
}

// Vars lists every setting in the order docs/operations.md shows them.
var Vars = []Var{
	{"DATABASE_URL", "postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable", "PostgreSQL connection string"},
	{"DATABASE_DIRECT_URL", "", "PostgreSQL itself when `DATABASE_URL` goes through a pooler in transaction mode: the migrations (`valruns migrate`, `MIGRATE_ON_START` and the check at start) hold a session advisory lock, so they connect here; empty = `DATABASE_URL`. Required with `DATABASE_POOLER=transaction`"},
	{"DATABASE_POOLER", "none", "what `DATABASE_URL` reaches: `none` (PostgreSQL, or a pooler in session mode) or `transaction` (PgBouncer's `pool_mode = transaction` or another pooler that hands each transaction to any server connection): then pgx sends no prepared statement (its `exec` mode unless the URL's `default_query_exec_mode` says `cache_describe` or `simple_protocol`) and no session parameter (set `statement_timeout` on the role instead: see Running at scale)"},
	{"DATABASE_MAX_CONNS", "12", "connections each process keeps to PostgreSQL at most; requests beyond them queue for one, organisations taking turns. More is not faster: a few per database core keep PostgreSQL busiest (see Performance)"},
	{"DATABASE_ACQUIRE_TIMEOUT", "5s", "longest a request waits for a database connection (connecting included); past it, 503 `service_unavailable` with `Retry-After`"},
	{"DATABASE_ANSWER_TIMEOUT", "5s", "longest a request waits for the database's answer to its first statement (a read: to its statements); past it, 503 `service_unavailable` with `Retry-After`, so a hung PostgreSQL does not hang requests. Later statements of a start are bounded by `IDEMPOTENCY_TX_TIMEOUT`"},
	{"REDIS_URL", "redis://127.0.0.1:6379/0", "Redis connection string: `redis://[:PASSWORD@]HOST:PORT/DB`, `rediss://` for TLS, or for Redis Sentinel `redis-sentinel://[:PASSWORD@]HOST1:PORT1,HOST2:PORT2,.../DB?master=NAME` (the sentinels' addresses; `PASSWORD` is the Redis servers', `&sentinel_password=` the sentinels' if they have one). Everything that talks to Redis (the queue, the scheduler, the sweeper, the fair gate, the rate limit) follows the master Sentinel names"},
	{"HTTP_ADDR", "127.0.0.1:8080", "listen address of `valruns serve`"},
	{"IDEMPOTENCY_TTL", "24h", "how long a stored response is replayed; an older key is processed as new. At most 168h (7 days): the keys are partitioned by day of expiry, and every lookup reads the partitions a key can be in"},
	{"IDEMPOTENCY_TX_TIMEOUT", "30s", "deadline of the request transaction (it ignores client hang-ups)"},
	{"IDEMPOTENCY_KEY_REQUIRED", "false", "`true`: a request without Idempotency-Key on an idempotent route is 400 `idempotency_key_missing`"},
	{"IDEMPOTENCY_MAX_WAIT", "10s", "longest a request with `Prefer: wait=N` waits for the in-flight request with its key (then 409); 0 disables waiting"},
	{"IDEMPOTENCY_MAX_WAITERS", "64", "requests that may wait at once per API process (`Prefer: wait`), shared among organisations: one holds at most a quarter, and one with none waiting always gets one; past it, 409 at once"},
	{"DEFAULT_MONTHLY_RUN_QUOTA", "0", "runs per organisation per calendar month (UTC); 0 = unlimited; an org's own quota wins"},
	{"ORG_START_RATE", "100", "starts per second per organisation, shared by all API processes (a token bucket in Redis, burst: one second's worth); past it, 429 `rate_limited` with `Retry-After`, not stored against the key; 0 = unlimited; an org's own rate (`valruns org rate`) wins"},
	{"RATE_LIMIT_HOLD", "250ms", "how long a start refused by `ORG_START_RATE` is held at least before its 429 is sent: each refusal is held between this and twice it, at random, so that clients refused together do not come back together (its `Retry-After` counts from the answer); so that a client that retries at once, ignoring `Retry-After`, sends at most a few starts a second per connection and a flood of refused starts leaves the CPU to the other organisations. At most 1,024 refusals are held at once per API process (the rest are answered at once), and a held one does not count against `MAX_REQUESTS_IN_FLIGHT`; 0 = answer at once"},
	{"ORG_RUN_SHARE", "0", "runs of one organisation that may be in the queue at once, so another organisation's run waits behind at most this many of its runs; the rest wait their turn, in order; 0 = adaptive: what the organisation's recent runs take about 0.5 s to execute on the worker slots alive, between 2 and 16 runs per slot; an org's own share (`valruns org share`) wins"},
	{"CLEANUP_SCHEDULE", "@hourly", "asynq cron spec of the expired-key cleanup (`@every 1m`, `0 * * * *`)"},
	{"CLEANUP_BATCH_SIZE", "1000", "webhook deliveries deleted per cleanup transaction (expired keys go with their day's partition)"},
	{"MAX_BODY_BYTES", "1048576", "largest accepted request body; larger is 413"},
	{"MAX_REQUESTS_IN_FLIGHT", "256", "`/api/` requests one API process serves at once; past it a request waits up to `OVERLOAD_WAIT`, then 503 `overloaded` with `Retry-After`; 0 = unlimited"},
	{"MAX_BODY_BYTES_IN_FLIGHT", "", "request bodies one API process holds at once, in bytes, each counted by its `Content-Length` (`MAX_BODY_BYTES` when unknown, chunked or gzip); past it a request waits up to `OVERLOAD_WAIT`, then 503 `overloaded` with `Retry-After` (its body read and dropped, never held); empty = 8 x `MAX_BODY_BYTES` (8 MiB), 0 = unlimited, else at least `MAX_BODY_BYTES`"},
	{"OVERLOAD_WAIT", "1s", "longest a request waits for room under `MAX_REQUESTS_IN_FLIGHT` and `MAX_BODY_BYTES_IN_FLIGHT` before 503 `overloaded`; 0 = answer at once"},
	{"LOG_LEVEL", "info", "debug, info, warn, error"},
	{"LOG_FORMAT", "text", "text or json"},
	{"MIGRATE_ON_START", "false", "`true`: `serve`/`worker` apply pending migrations instead of refusing to start"},
	{"AUTH_CACHE_TTL", "30s", "how long a verified API token is trusted without a database read; 0 disables"},
	{"SHUTDOWN_TIMEOUT", "20s", "graceful shutdown deadline"},
	{"SHUTDOWN_DRAIN", "5s", "how long `serve` keeps serving after SIGTERM or SIGINT with `/readyz` answering 503, so a load balancer stops sending it requests, before it stops accepting them and shuts down (then `SHUTDOWN_TIMEOUT`); a second signal ends the drain; 0 = no drain"},
	{"WORKER_CONCURRENCY", "40", "runs one worker process validates at once: it takes that many from the ready list (the hand-off), and no more; a run whose outcome is computed gives its slot back while its final write waits (at most 256 such runs); webhook attempts have slots of their own (`WEBHOOK_CONCURRENCY`)"},
	{"RUN_LEASE", "15s", "how long a claim or heartbeat holds a running run; a dead worker's run is taken over once it runs out"},
	{"RUN_HEARTBEAT", "0", "how often a worker renews the lease of a run it executes; 0 = a third of `RUN_LEASE`; must be shorter than `RUN_LEASE`"},
	{"RUN_MAX_RETRY", "5", "retries of a failing run task before the run ends in status `error`; a run is started at most this + 1 times"},
	{"RUN_RETRY_DELAY", "1s", "delay before a failing run task's first retry, doubled per retry up to 1m; a database outage is retried at this pace without spending retries"},
	{"RUN_TIMEOUT", "5m", "longest one execution of a run may take, behind the validation engine's own limits; past it the run ends `error`"},
	{"RUN_SWEEP_INTERVAL", "10s", "how often each worker looks for stranded runs (queued with their task lost, or running with an expired lease) and re-enqueues them"},
	{"RUN_POLL_INTERVAL", "10s", "how often a worker's asynq server looks for retries that are due and for the cleanup's task (`TaskCheckInterval` and `DelayedTaskCheckInterval`): a retry waits up to about this much past its delay; new runs never wait on it, a worker blocks on the ready list for them"},
	{"RUN_FAST_PATH", "1s", "how long a run's first delivery may validate it without claiming it (one write per run; at most RUN_HEARTBEAT); past it the run is claimed and validated under a lease; 0 claims every run first"},
	{"RUN_REDELIVER_AFTER", "10s", "how long a run may stay queued before the sweeper checks that Redis still has its task; also how long before it looks at the same run again"},
	{"RUN_MAX_WAIT", "30s", "longest `GET /api/runs/{id}/` with `Prefer: wait=N` waits for the run to become final (then answers it as it is); 0 disables waiting: the run is answered at once"},
	{"RUN_MAX_WAITERS", "1000", "run reads that may wait at once per API process (`Prefer: wait`), one organisation at most a quarter of them; past either, a read is answered at once, without `Preference-Applied`"},
	{"WORKER_METRICS_ADDR", "127.0.0.1:9091", "where `valruns worker` serves /metrics, /healthz (liveness) and /readyz (503 while PostgreSQL or Redis does not answer or its task server is not running); `serve --worker` uses the API's, whose /readyz includes the worker's"},
	{"WEBHOOK_ALLOW_PRIVATE_TARGETS", "false", "`true`: webhook endpoints may point at loopback, private, link-local and metadata addresses (local development and tests); otherwise such a URL is refused (400 `validation_error`), when the endpoint is created and when a delivery resolves its host"},
	{"WEBHOOK_CONCURRENCY", "10", "webhook delivery attempts one worker makes at once, beside (not among) its `WORKER_CONCURRENCY` run slots; 0: this worker sends no webhooks"},
	{"WEBHOOK_POLL_INTERVAL", "1s", "how often a worker looks for webhook deliveries due; a worker that ends a run looks at once (at most ten times as often)"},
	{"WEBHOOK_RETRY_BASE", "5s", "delay after a delivery's first failed attempt, four times longer after each further one up to 8h (5s: 5s, 20s, 80s, 5m, 21m, 85m, 5.7h, 8h...)"},
	{"WEBHOOK_RETRY_HORIZON", "24h", "how long after its event a delivery is retried; then it is `failed`"},
	{"WEBHOOK_DELIVERY_RETENTION", "720h", "how long a webhook delivery `delivered` or `failed` is kept (its deliveries list shows it) before the periodic cleanup deletes it; pending ones are kept"},
	{"WEBHOOK_CLAIM_LEASE", "2m", "how long a worker's claim holds a webhook delivery for one attempt; an attempt whose outcome is not recorded by then (its worker died, the write failed) is made again, with the same `webhook-id`, within this plus `WEBHOOK_POLL_INTERVAL`. At least 1s; keep it well above an attempt's 10 s limit, or a slow receiver gets the event twice at once"},
	{"PPROF_ADDR", "", "`host:port` where `serve` and `worker` serve Go's /debug/pprof/ for profiling; empty (the default) serves nothing. Keep it on loopback"},
}

// Error is a configuration error naming the variable at fault.
type Error struct {
	Var, Value, Problem string
}

func (e *Error) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("config: %s: %s", e.Var, e.Problem)
	}
	return fmt.Sprintf("config: %s=%q: %s", e.Var, e.Value, e.Problem)
}

// FromEnv loads the configuration from the process environment.
func FromEnv() (Config, error) { return Load(os.LookupEnv) }

// MemoryLimit is the soft memory limit `valruns serve` gives the Go runtime
// (debug.SetMemoryLimit) unless GOMEMLIMIT is set. For the API: 64 MiB for
// the process at rest and its small requests, plus 12 bytes per byte of
// MaxBodyBytesInFlight, what admitted bodies can take at their peak (a
// start holds its body as read, its canonical copy, the database's
// encodings and its answer: see docs/api.md, Rate limits and overload).
// With the worker in the same process (worker), it counts the worker too:
// 32 MiB more for the worker at rest, and twice MaxBodyBytes for each of
// its WorkerConcurrency slots (a run holds its submission as read and as
// queued). Near it the garbage collector runs sooner, rather than let a
// burst's garbage double the heap (GOGC) before the next collection; it is
// no cap: live memory past it is kept, and collecting then takes at most
// half the CPU. With the defaults, 160 MiB for serve and 272 MiB for
// serve --worker; 0 (no limit) when MaxBodyBytesInFlight is unlimited.
func (c Config) MemoryLimit(worker bool) int64 {
	if c.MaxBodyBytesInFlight <= 0 {
		return 0
	}
	limit := 64<<20 + 12*c.MaxBodyBytesInFlight
	if worker {
		limit += 32<<20 + 2*c.MaxBodyBytes*int64(c.WorkerConcurrency)
	}
	return limit
}

// Load builds a Config from lookup (os.LookupEnv in production, a map in
// tests). Unset or empty variables take their default.
func Load(lookup func(string) (string, bool)) (Config, error) {
	p := parser{lookup: lookup}
	c := Config{
		DatabaseURL:                p.url("DATABASE_URL", "postgres", "postgresql"),
		DatabaseDirectURL:          p.optionalURL("DATABASE_DIRECT_URL", "postgres", "postgresql"),
		DatabasePooler:             p.oneOf("DATABASE_POOLER", "none", "transaction"),
		DatabaseMaxConns:           int(p.int("DATABASE_MAX_CONNS", 1)),
		DatabaseAcquireTimeout:     p.duration("DATABASE_ACQUIRE_TIMEOUT", 10*time.Millisecond),
		DatabaseAnswerTimeout:      p.duration("DATABASE_ANSWER_TIMEOUT", 10*time.Millisecond),
		RedisURL:                   p.redisURL("REDIS_URL"),
		HTTPAddr:                   p.addr("HTTP_ADDR"),
		IdempotencyTTL:             p.duration("IDEMPOTENCY_TTL", time.Second),
		IdempotencyTxTimeout:       p.duration("IDEMPOTENCY_TX_TIMEOUT", time.Millisecond),
		IdempotencyKeyRequired:     p.bool("IDEMPOTENCY_KEY_REQUIRED"),
		IdempotencyMaxWait:         p.duration("IDEMPOTENCY_MAX_WAIT", 0),
		IdempotencyMaxWaiters:      int(p.int("IDEMPOTENCY_MAX_WAITERS", 1)),
		DefaultMonthlyRunQuota:     p.int("DEFAULT_MONTHLY_RUN_QUOTA", 0),
		OrgStartRate:               int(p.int("ORG_START_RATE", 0)),
		RateLimitHold:              p.duration("RATE_LIMIT_HOLD", 0),
		OrgRunShare:                int(p.int("ORG_RUN_SHARE", 0)),
		CleanupSchedule:            p.schedule("CLEANUP_SCHEDULE"),
		CleanupBatchSize:           int(p.int("CLEANUP_BATCH_SIZE", 1)),
		MaxBodyBytes:               p.int("MAX_BODY_BYTES", 1),
		MaxRequestsInFlight:        int(p.int("MAX_REQUESTS_IN_FLIGHT", 0)),
		MaxBodyBytesInFlight:       p.intOr("MAX_BODY_BYTES_IN_FLIGHT", 0, -1),
		OverloadWait:               p.duration("OVERLOAD_WAIT", 0),
		LogLevel:                   p.oneOf("LOG_LEVEL", "debug", "info", "warn", "error"),
		LogFormat:                  p.oneOf("LOG_FORMAT", "text", "json"),
		MigrateOnStart:             p.bool("MIGRATE_ON_START"),
		AuthCacheTTL:               p.duration("AUTH_CACHE_TTL", 0),
		ShutdownTimeout:            p.duration("SHUTDOWN_TIMEOUT", time.Millisecond),
		ShutdownDrain:              p.duration("SHUTDOWN_DRAIN", 0),
		WorkerConcurrency:          int(p.int("WORKER_CONCURRENCY", 1)),
		RunLease:                   p.duration("RUN_LEASE", time.Second),
		RunHeartbeat:               p.duration("RUN_HEARTBEAT", 0),
		RunMaxRetry:                int(p.int("RUN_MAX_RETRY", 1)),
		RunRetryDelay:              p.duration("RUN_RETRY_DELAY", 10*time.Millisecond),
		RunTimeout:                 p.duration("RUN_TIMEOUT", time.Second),
		RunSweepInterval:           p.duration("RUN_SWEEP_INTERVAL", 100*time.Millisecond),
		RunPollInterval:            p.duration("RUN_POLL_INTERVAL", time.Millisecond),
		RunRedeliverAfter:          p.duration("RUN_REDELIVER_AFTER", 100*time.Millisecond),
		RunFastPath:                p.duration("RUN_FAST_PATH", 0),
		RunMaxWait:                 p.duration("RUN_MAX_WAIT", 0),
		RunMaxWaiters:              int(p.int("RUN_MAX_WAITERS", 1)),
		WorkerMetricsAddr:          p.addr("WORKER_METRICS_ADDR"),
		PprofAddr:                  p.optionalAddr("PPROF_ADDR"),
		WebhookAllowPrivateTargets: p.bool("WEBHOOK_ALLOW_PRIVATE_TARGETS"),
		WebhookConcurrency:         int(p.int("WEBHOOK_CONCURRENCY", 0)),
		WebhookPollInterval:        p.duration("WEBHOOK_POLL_INTERVAL", 10*time.Millisecond),
		WebhookRetryBase:           p.duration("WEBHOOK_RETRY_BASE", 10*time.Millisecond),
		WebhookRetryHorizon:        p.duration("WEBHOOK_RETRY_HORIZON", time.Second),
		WebhookDeliveryRetention:   p.duration("WEBHOOK_DELIVERY_RETENTION", time.Minute),
		WebhookClaimLease:          p.duration("WEBHOOK_CLAIM_LEASE", time.Second),
	}
	if p.err == nil && c.MaxBodyBytesInFlight < 0 {
		// Unset: room for eight of the largest bodies, or a few dozen
		// ordinary heavy ones. What a body costs while it is served is
		// many times its size (see MemoryLimit).
		c.MaxBodyBytesInFlight = 8 * c.MaxBodyBytes
	}
	if p.err == nil && c.MaxBodyBytesInFlight != 0 && c.MaxBodyBytesInFlight < c.MaxBodyBytes {
		// A body of MaxBodyBytes could never be admitted.
		p.fail("MAX_BODY_BYTES_IN_FLIGHT", p.raw("MAX_BODY_BYTES_IN_FLIGHT"),
			fmt.Sprintf("must be 0 (unlimited) or at least MAX_BODY_BYTES (%d)", c.MaxBodyBytes))
	}
	switch {
	case p.err != nil:
	case c.DatabaseDirectURL != "":
	case c.DatabasePooler == "transaction":
		// Through the pooler, the migrations' session lock would be taken on
		// one server connection and released on another.
		p.fail("DATABASE_DIRECT_URL", "", "required with DATABASE_POOLER=transaction: the migrations need a session on PostgreSQL itself")
	default:
		c.DatabaseDirectURL = c.DatabaseURL
	}
	if p.err == nil && c.IdempotencyTTL > MaxIdempotencyTTL {
		p.fail("IDEMPOTENCY_TTL", p.raw("IDEMPOTENCY_TTL"), fmt.Sprintf("must be at most %s", MaxIdempotencyTTL))
	}
	switch {
	case p.err != nil:
	case c.RunHeartbeat == 0:
		c.RunHeartbeat = c.RunLease / 3
	case c.RunHeartbeat >= c.RunLease:
		p.fail("RUN_HEARTBEAT", p.raw("RUN_HEARTBEAT"), fmt.Sprintf("must be shorter than RUN_LEASE (%s)", c.RunLease))
	case c.RunHeartbeat < 10*time.Millisecond:
		p.fail("RUN_HEARTBEAT", p.raw("RUN_HEARTBEAT"), "must be 0 (a third of RUN_LEASE) or at least 10ms")
	}
	if p.err != nil {
		return Config{}, p.err
	}
	return c, nil
}

// MaxIdempotencyTTL bounds IDEMPOTENCY_TTL: a key's row lives in the day
// partition of its expiry, the partitions are made that far ahead, and
// every lookup of a key reads each partition it could be in.
const MaxIdempotencyTTL = 7 * 24 * time.Hour

// parser keeps the first error so Load reads as a list of fields.
type parser struct {
	lookup func(string) (string, bool)
	err    error
}

func (p *parser) raw(name string) string {
	if v, ok := p.lookup(name); ok && strings.TrimSpace(v) != "" {
		return strings.TrimSpace(v)
	}
	for _, v := range Vars {
		if v.Name == name {
			return v.Default
		}
	}
	panic("config: no default for " + name)
}

func (p *parser) fail(name, value, problem string) {
	if p.err == nil {
		p.err = &Error{Var: name, Value: value, Problem: problem}
	}
}

func (p *parser) schedule(name string) string {
	v := p.raw(name)
	if _, err := ParseSchedule(v); err != nil {
		p.fail(name, v, err.Error())
	}
	return v
}

// ParseSchedule reads a cron spec as asynq's Scheduler does (five fields,
// or a descriptor such as @hourly or @every 10m) and refuses ticks less
// than a second apart.
func ParseSchedule(spec string) (cron.Schedule, error) {
	s, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, fmt.Errorf("not a cron spec (such as @hourly, @every 10m or 0 * * * *): %v", err)
	}
	first := s.Next(time.Now())
	if s.Next(first).Sub(first) < time.Second {
		return nil, fmt.Errorf("ticks must be at least 1s apart")
	}
	return s, nil
}

func (p *parser) oneOf(name string, allowed ...string) string {
	v := strings.ToLower(p.raw(name))
	for _, a := range allowed {
		if v == a {
			return v
		}
	}
	p.fail(name, v, "must be one of "+strings.Join(allowed, ", "))
	return ""
}

func (p *parser) bool(name string) bool {
	v := p.raw(name)
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.fail(name, v, "must be true or false")
	}
	return b
}

func (p *parser) int(name string, min int64) int64 {
	v := p.raw(name)
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil:
		p.fail(name, v, "must be a whole number")
	case n < min:
		p.fail(name, v, fmt.Sprintf("must be at least %d", min))
	}
	return n
}

// intOr is int, or unset when the variable and its default are empty.
func (p *parser) intOr(name string, min, unset int64) int64 {
	if p.raw(name) == "" {
		return unset
	}
	return p.int(name, min)
}

func (p *parser) duration(name string, min time.Duration) time.Duration {
	v := p.raw(name)
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		p.fail(name, v, "must be a duration such as 30s, 5m or 24h")
	case d < 0:
		p.fail(name, v, "must not be negative")
	case d < min:
		p.fail(name, v, fmt.Sprintf("must be at least %s", min))
	}
	return d
}

func (p *parser) url(name string, schemes ...string) string {
	v := p.raw(name)
	u, err := url.Parse(v)
	if err != nil {
		p.fail(name, v, "is not a URL")
		return v
	}
	for _, s := range schemes {
		if u.Scheme == s {
			return v
		}
	}
	p.fail(name, v, "scheme must be "+strings.Join(schemes, " or "))
	return v
}

// optionalURL is url, or "" when the variable is unset or empty.
func (p *parser) optionalURL(name string, schemes ...string) string {
	if p.raw(name) == "" {
		return ""
	}
	return p.url(name, schemes...)
}

// redisURL is a Redis URL: redis://, rediss://, or redis-sentinel:// with
// at least one sentinel address and the master's name.
func (p *parser) redisURL(name string) string {
	v := p.url(name, "redis", "rediss", "redis-sentinel")
	if p.err != nil {
		return v
	}
	if u, _ := url.Parse(v); u.Scheme == "redis-sentinel" {
		for _, a := range strings.Split(u.Host, ",") {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				p.fail(name, v, "a Sentinel URL lists the sentinels as host:port, separated by commas")
				return v
			}
		}
		if u.Query().Get("master") == "" {
			p.fail(name, v, "a Sentinel URL names its master: ?master=NAME")
		}
	}
	return v
}

// optionalAddr is addr, or "" when the variable is unset or empty.
func (p *parser) optionalAddr(name string) string {
	if p.raw(name) == "" {
		return ""
	}
	return p.addr(name)
}

func (p *parser) addr(name string) string {
	v := p.raw(name)
	if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
		p.fail(name, v, "must be host:port (such as :8080 or 127.0.0.1:8080)")
	}
	return v
}
