package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
)

// env is a lookup over a map, standing in for os.LookupEnv.
func env(m map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// documented is the configuration docs/operations.md (config.Vars) promises with no
// environment at all.
var documented = config.Config{
	DatabaseURL:              "postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable",
	DatabaseDirectURL:        "postgres://postgres@127.0.0.1:5432/valruns?sslmode=disable", // unset: DATABASE_URL
	DatabasePooler:           "none",
	DatabaseMaxConns:         12,
	DatabaseAcquireTimeout:   5 * time.Second,
	DatabaseAnswerTimeout:    5 * time.Second,
	RedisURL:                 "redis://127.0.0.1:6379/0",
	HTTPAddr:                 "127.0.0.1:8080",
	IdempotencyTTL:           24 * time.Hour,
	IdempotencyTxTimeout:     30 * time.Second,
	IdempotencyKeyRequired:   false,
	IdempotencyMaxWait:       10 * time.Second,
	IdempotencyMaxWaiters:    64,
	DefaultMonthlyRunQuota:   0,
	OrgStartRate:             100,
	RateLimitHold:            250 * time.Millisecond,
	OrgRunShare:              0,
	CleanupSchedule:          "@hourly",
	CleanupBatchSize:         1000,
	MaxBodyBytes:             1 << 20,
	MaxRequestsInFlight:      256,
	MaxBodyBytesInFlight:     8 << 20, // unset: 8 x MAX_BODY_BYTES
	OverloadWait:             time.Second,
	LogLevel:                 "info",
	LogFormat:                "text",
	MigrateOnStart:           false,
	AuthCacheTTL:             30 * time.Second,
	ShutdownTimeout:          20 * time.Second,
	ShutdownDrain:            5 * time.Second,
	WorkerConcurrency:        40,
	RunLease:                 15 * time.Second,
	RunHeartbeat:             5 * time.Second, // RUN_HEARTBEAT=0: a third of RUN_LEASE
	RunMaxRetry:              5,
	RunRetryDelay:            time.Second,
	RunTimeout:               5 * time.Minute,
	RunSweepInterval:         10 * time.Second,
	RunPollInterval:          10 * time.Second,
	RunFastPath:              time.Second,
	RunRedeliverAfter:        10 * time.Second,
	WorkerMetricsAddr:        "127.0.0.1:9091",
	RunMaxWait:               30 * time.Second,
	RunMaxWaiters:            1000,
	WebhookConcurrency:       10,
	WebhookPollInterval:      time.Second,
	WebhookRetryBase:         5 * time.Second,
	WebhookRetryHorizon:      24 * time.Hour,
	WebhookDeliveryRetention: 30 * 24 * time.Hour,
	WebhookClaimLease:        2 * time.Minute,
}

func TestDefaults(t *testing.T) {
	t.Parallel()

	t.Run("no environment", func(t *testing.T) {
		t.Parallel()
		got, err := config.Load(env(nil))
		require.NoError(t, err)
		if d := cmp.Diff(documented, got); d != "" {
			t.Fatalf("defaults (-documented +loaded):\n%s", d)
		}
	})

	t.Run("empty and blank values take the default", func(t *testing.T) {
		t.Parallel()
		m := map[string]string{}
		for i, v := range config.Vars {
			m[v.Name] = []string{"", "   ", "\t"}[i%3]
		}
		got, err := config.Load(env(m))
		require.NoError(t, err)
		if d := cmp.Diff(documented, got); d != "" {
			t.Fatalf("(-documented +loaded):\n%s", d)
		}
	})

	t.Run("each documented default, set explicitly, loads the same", func(t *testing.T) {
		t.Parallel()
		m := map[string]string{}
		for _, v := range config.Vars {
			m[v.Name] = v.Default
		}
		got, err := config.Load(env(m))
		require.NoError(t, err)
		if d := cmp.Diff(documented, got); d != "" {
			t.Fatalf("(-documented +loaded):\n%s", d)
		}
	})
}

func TestVarsDocumentEverythingLoadReads(t *testing.T) {
	t.Parallel()
	asked := map[string]bool{}
	_, err := config.Load(func(name string) (string, bool) {
		asked[name] = true
		return "", false
	})
	require.NoError(t, err)

	listed := map[string]bool{}
	for _, v := range config.Vars {
		require.False(t, listed[v.Name], "%s listed twice", v.Name)
		listed[v.Name] = true
		// Off unless set; DATABASE_URL unless set; 2 x MAX_BODY_BYTES unless set.
		if v.Name != "PPROF_ADDR" && v.Name != "DATABASE_DIRECT_URL" && v.Name != "MAX_BODY_BYTES_IN_FLIGHT" {
			require.NotEmpty(t, v.Default, "%s has no default", v.Name)
		}
		require.NotEmpty(t, v.Doc, "%s has no doc", v.Name)
	}
	if d := cmp.Diff(listed, asked); d != "" {
		t.Fatalf("variables listed in Vars vs read by Load (-listed +read):\n%s", d)
	}
	// The contract names these; they must stay configurable.
	for _, name := range []string{
		"DATABASE_URL", "REDIS_URL", "HTTP_ADDR", "IDEMPOTENCY_TTL", "IDEMPOTENCY_TX_TIMEOUT",
		"DEFAULT_MONTHLY_RUN_QUOTA", "IDEMPOTENCY_KEY_REQUIRED", "CLEANUP_SCHEDULE",
		"CLEANUP_BATCH_SIZE", "MAX_BODY_BYTES", "LOG_LEVEL", "LOG_FORMAT",
	} {
		require.True(t, listed[name], "%s missing from config.Vars", name)
	}
}

func TestGoodValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		env   map[string]string
		check func(t *testing.T, c config.Config)
	}{
		{"postgresql scheme", map[string]string{"DATABASE_URL": "postgresql://u:p@db:5432/x"},
			func(t *testing.T, c config.Config) { require.Equal(t, "postgresql://u:p@db:5432/x", c.DatabaseURL) }},
		{"rediss scheme", map[string]string{"REDIS_URL": "rediss://cache:6380/1"},
			func(t *testing.T, c config.Config) { require.Equal(t, "rediss://cache:6380/1", c.RedisURL) }},
		{"redis sentinel", map[string]string{"REDIS_URL": "redis-sentinel://:pw@s1:26379,s2:26380/2?master=mymaster"},
			func(t *testing.T, c config.Config) {
				require.Equal(t, "redis-sentinel://:pw@s1:26379,s2:26380/2?master=mymaster", c.RedisURL)
			}},
		{"behind a transaction pooler", map[string]string{"DATABASE_URL": "postgres://u@bouncer:6432/x",
			"DATABASE_POOLER": "transaction", "DATABASE_DIRECT_URL": "postgres://u@db:5432/x"},
			func(t *testing.T, c config.Config) {
				require.Equal(t, "transaction", c.DatabasePooler)
				require.Equal(t, "postgres://u@bouncer:6432/x", c.DatabaseURL)
				require.Equal(t, "postgres://u@db:5432/x", c.DatabaseDirectURL)
			}},
		{"multi-host database URL", map[string]string{"DATABASE_URL": "postgres://u@h1:5432,h2:5433/x?target_session_attrs=read-write"},
			func(t *testing.T, c config.Config) {
				require.Equal(t, "postgres://u@h1:5432,h2:5433/x?target_session_attrs=read-write", c.DatabaseDirectURL)
			}},
		{"port-only address", map[string]string{"HTTP_ADDR": ":9090"},
			func(t *testing.T, c config.Config) { require.Equal(t, ":9090", c.HTTPAddr) }},
		{"surrounding spaces trimmed", map[string]string{"HTTP_ADDR": "  0.0.0.0:80 "},
			func(t *testing.T, c config.Config) { require.Equal(t, "0.0.0.0:80", c.HTTPAddr) }},
		{"durations", map[string]string{"IDEMPOTENCY_TTL": "1h30m", "IDEMPOTENCY_TX_TIMEOUT": "250ms", "RUN_LEASE": "1s"},
			func(t *testing.T, c config.Config) {
				require.Equal(t, 90*time.Minute, c.IdempotencyTTL)
				require.Equal(t, 250*time.Millisecond, c.IdempotencyTxTimeout)
				require.Equal(t, time.Second, c.RunLease)
			}},
		{"waiting disabled, pprof on", map[string]string{"IDEMPOTENCY_MAX_WAIT": "0", "PPROF_ADDR": "127.0.0.1:6060"},
			func(t *testing.T, c config.Config) {
				require.Zero(t, c.IdempotencyMaxWait)
				require.Equal(t, "127.0.0.1:6060", c.PprofAddr)
			}},
		{"run long-poll", map[string]string{"RUN_MAX_WAIT": "0", "RUN_MAX_WAITERS": "5"},
			func(t *testing.T, c config.Config) {
				require.Zero(t, c.RunMaxWait, "0 disables waiting")
				require.Equal(t, 5, c.RunMaxWaiters)
			}},
		{"worker timings", map[string]string{"RUN_LEASE": "3s", "RUN_HEARTBEAT": "500ms", "RUN_RETRY_DELAY": "10ms",
			"RUN_TIMEOUT": "1m", "RUN_SWEEP_INTERVAL": "100ms", "RUN_REDELIVER_AFTER": "2s"},
			func(t *testing.T, c config.Config) {
				require.Equal(t, 3*time.Second, c.RunLease)
				require.Equal(t, 500*time.Millisecond, c.RunHeartbeat)
				require.Equal(t, 10*time.Millisecond, c.RunRetryDelay)
				require.Equal(t, time.Minute, c.RunTimeout)
				require.Equal(t, 100*time.Millisecond, c.RunSweepInterval)
				require.Equal(t, 2*time.Second, c.RunRedeliverAfter)
			}},
		{"the heartbeat follows the lease unless set", map[string]string{"RUN_LEASE": "3s"},
			func(t *testing.T, c config.Config) {
				require.Equal(t, 3*time.Second, c.RunLease)
				require.Equal(t, time.Second, c.RunHeartbeat)
			}},
		{"webhook claim lease", map[string]string{"WEBHOOK_CLAIM_LEASE": "3s"},
			func(t *testing.T, c config.Config) { require.Equal(t, 3*time.Second, c.WebhookClaimLease) }},
		{"auth cache disabled", map[string]string{"AUTH_CACHE_TTL": "0"},
			func(t *testing.T, c config.Config) { require.Zero(t, c.AuthCacheTTL) }},
		{"bools", map[string]string{"IDEMPOTENCY_KEY_REQUIRED": "true", "MIGRATE_ON_START": "1"},
			func(t *testing.T, c config.Config) {
				require.True(t, c.IdempotencyKeyRequired)
				require.True(t, c.MigrateOnStart)
			}},
		{"quota", map[string]string{"DEFAULT_MONTHLY_RUN_QUOTA": "500"},
			func(t *testing.T, c config.Config) { require.EqualValues(t, 500, c.DefaultMonthlyRunQuota) }},
		{"org limits", map[string]string{"ORG_START_RATE": "0", "ORG_RUN_SHARE": "40"},
			func(t *testing.T, c config.Config) {
				require.Equal(t, 0, c.OrgStartRate)
				require.Equal(t, 40, c.OrgRunShare)
			}},
		{"sizes", map[string]string{"CLEANUP_BATCH_SIZE": "1", "MAX_BODY_BYTES": "1", "WORKER_CONCURRENCY": "64"},
			func(t *testing.T, c config.Config) {
				require.Equal(t, 1, c.CleanupBatchSize)
				require.EqualValues(t, 1, c.MaxBodyBytes)
				require.Equal(t, 64, c.WorkerConcurrency)
			}},
		{"overload bounds", map[string]string{"MAX_REQUESTS_IN_FLIGHT": "0", "MAX_BODY_BYTES_IN_FLIGHT": "2048", "MAX_BODY_BYTES": "1024", "OVERLOAD_WAIT": "0"},
			func(t *testing.T, c config.Config) {
				require.Zero(t, c.MaxRequestsInFlight)
				require.EqualValues(t, 2048, c.MaxBodyBytesInFlight)
				require.Zero(t, c.OverloadWait)
			}},
		{"no overload bounds", map[string]string{"MAX_BODY_BYTES_IN_FLIGHT": "0"},
			func(t *testing.T, c config.Config) {
				require.Zero(t, c.MaxBodyBytesInFlight)
				require.Zero(t, c.MemoryLimit(false), "no bound on bodies: no soft memory limit either")
				require.Zero(t, c.MemoryLimit(true))
			}},
		{"body budget follows MAX_BODY_BYTES", map[string]string{"MAX_BODY_BYTES": "4194304", "MAX_BODY_BYTES_IN_FLIGHT": " "},
			func(t *testing.T, c config.Config) {
				require.EqualValues(t, 32<<20, c.MaxBodyBytesInFlight, "unset: room for eight of the largest bodies")
				require.EqualValues(t, 64<<20+12*(32<<20), c.MemoryLimit(false))
				require.EqualValues(t, 64<<20+12*(32<<20)+32<<20+2*(4<<20)*40, c.MemoryLimit(true), "the worker's slots counted too")
			}},
		{"log level and format are case-insensitive", map[string]string{"LOG_LEVEL": "DEBUG", "LOG_FORMAT": "Json"},
			func(t *testing.T, c config.Config) {
				require.Equal(t, "debug", c.LogLevel)
				require.Equal(t, "json", c.LogFormat)
			}},
		{"cleanup schedule @every", map[string]string{"CLEANUP_SCHEDULE": "@every 1m"},
			func(t *testing.T, c config.Config) { require.Equal(t, "@every 1m", c.CleanupSchedule) }},
		{"cleanup schedule in five fields", map[string]string{"CLEANUP_SCHEDULE": "*/15 * * * *"},
			func(t *testing.T, c config.Config) { require.Equal(t, "*/15 * * * *", c.CleanupSchedule) }},
		{"cleanup schedule with a time zone", map[string]string{"CLEANUP_SCHEDULE": "CRON_TZ=UTC 0 3 * * *"},
			func(t *testing.T, c config.Config) { require.Equal(t, "CRON_TZ=UTC 0 3 * * *", c.CleanupSchedule) }},
		{"cleanup schedule @daily", map[string]string{"CLEANUP_SCHEDULE": "@daily"},
			func(t *testing.T, c config.Config) { require.Equal(t, "@daily", c.CleanupSchedule) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := config.Load(env(tt.env))
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

func TestBadValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, value string
	}{
		{"DATABASE_URL", "mysql://root@127.0.0.1/valruns"},
		{"DATABASE_URL", "://no-scheme"},
		{"DATABASE_URL", "127.0.0.1:5432"},
		{"REDIS_URL", "http://127.0.0.1:6379"},
		{"REDIS_URL", "%zz"},
		{"REDIS_URL", "redis-sentinel://s1:26379,s2:26380/0"},           // no master
		{"REDIS_URL", "redis-sentinel://s1,s2:26380/0?master=mymaster"}, // a sentinel without its port
		{"DATABASE_POOLER", "pgbouncer"},                                // none or transaction
		{"DATABASE_POOLER", "transaction"},                              // without DATABASE_DIRECT_URL
		{"DATABASE_DIRECT_URL", "mysql://root@127.0.0.1/valruns"},
		{"HTTP_ADDR", "8080"},
		{"HTTP_ADDR", "localhost:"},
		{"HTTP_ADDR", "http://127.0.0.1:8080"},
		{"IDEMPOTENCY_TTL", "abc"},
		{"IDEMPOTENCY_TTL", "24"},
		{"IDEMPOTENCY_TTL", "-1h"},
		{"IDEMPOTENCY_TTL", "0s"},
		{"IDEMPOTENCY_TTL", "500ms"},
		{"IDEMPOTENCY_TTL", "169h"},
		{"IDEMPOTENCY_TX_TIMEOUT", "soon"},
		{"IDEMPOTENCY_TX_TIMEOUT", "0"},
		{"IDEMPOTENCY_TX_TIMEOUT", "-5s"},
		{"IDEMPOTENCY_KEY_REQUIRED", "yes"},
		{"IDEMPOTENCY_KEY_REQUIRED", "2"},
		{"DATABASE_MAX_CONNS", "0"},
		{"DATABASE_MAX_CONNS", "lots"},
		{"DATABASE_ACQUIRE_TIMEOUT", "0"},
		{"DATABASE_ACQUIRE_TIMEOUT", "soon"},
		{"DATABASE_ANSWER_TIMEOUT", "1ms"},
		{"DATABASE_ANSWER_TIMEOUT", "-1s"},
		{"IDEMPOTENCY_MAX_WAIT", "-1s"},
		{"IDEMPOTENCY_MAX_WAIT", "long"},
		{"IDEMPOTENCY_MAX_WAITERS", "0"},
		{"IDEMPOTENCY_MAX_WAITERS", "many"},
		{"RUN_MAX_WAIT", "-1s"},
		{"RUN_MAX_WAIT", "forever"},
		{"RUN_MAX_WAITERS", "0"},
		{"RUN_MAX_WAITERS", "-1"},
		{"PPROF_ADDR", "6060"},
		{"PPROF_ADDR", "http://127.0.0.1:6060"},
		{"DEFAULT_MONTHLY_RUN_QUOTA", "-1"},
		{"DEFAULT_MONTHLY_RUN_QUOTA", "ten"},
		{"DEFAULT_MONTHLY_RUN_QUOTA", "1.5"},
		{"ORG_START_RATE", "-1"},
		{"ORG_RUN_SHARE", "many"},
		{"MAX_REQUESTS_IN_FLIGHT", "-1"},
		{"MAX_BODY_BYTES_IN_FLIGHT", "1048575"}, // below MAX_BODY_BYTES: a full body could never enter
		{"MAX_BODY_BYTES_IN_FLIGHT", "64MB"},
		{"OVERLOAD_WAIT", "-1s"},
		{"WEBHOOK_CLAIM_LEASE", "0"},
		{"WEBHOOK_CLAIM_LEASE", "500ms"},
		{"WEBHOOK_CLAIM_LEASE", "-2m"},
		{"WEBHOOK_CLAIM_LEASE", "2 minutes"},
		// The worker's scheduler would refuse these at registration, long after start-up.
		{"CLEANUP_SCHEDULE", "every hour"},
		{"CLEANUP_SCHEDULE", "@fortnightly"},
		{"CLEANUP_SCHEDULE", "@every abc"},
		{"CLEANUP_SCHEDULE", "61 * * * *"},
		{"CLEANUP_SCHEDULE", "* * * *"},
		{"CLEANUP_BATCH_SIZE", "0"},
		{"CLEANUP_BATCH_SIZE", "-10"},
		{"CLEANUP_BATCH_SIZE", "many"},
		{"MAX_BODY_BYTES", "0"},
		{"MAX_BODY_BYTES", "-1"},
		{"MAX_BODY_BYTES", "1MB"},
		{"MAX_BODY_BYTES", "99999999999999999999"},
		{"LOG_LEVEL", "verbose"},
		{"LOG_LEVEL", "trace"},
		{"LOG_FORMAT", "xml"},
		{"MIGRATE_ON_START", "maybe"},
		{"AUTH_CACHE_TTL", "-1s"},
		{"AUTH_CACHE_TTL", "forever"},
		{"SHUTDOWN_TIMEOUT", "0"},
		{"SHUTDOWN_TIMEOUT", "later"},
		{"SHUTDOWN_DRAIN", "-1s"},
		{"SHUTDOWN_DRAIN", "5"},
		{"WORKER_CONCURRENCY", "0"},
		{"WORKER_CONCURRENCY", "-3"},
		{"RUN_LEASE", "100ms"},
		{"RUN_LEASE", "-5m"},
		{"RUN_HEARTBEAT", "15s"}, // not shorter than RUN_LEASE's default
		{"RUN_HEARTBEAT", "1m"},
		{"RUN_HEARTBEAT", "1ms"},
		{"RUN_HEARTBEAT", "-1s"},
		{"RUN_HEARTBEAT", "often"},
		{"RUN_MAX_RETRY", "0"},
		{"RUN_RETRY_DELAY", "0"},
		{"RUN_RETRY_DELAY", "1ms"},
		{"RUN_RETRY_DELAY", "soon"},
		{"RUN_TIMEOUT", "0"},
		{"RUN_TIMEOUT", "500ms"},
		{"RUN_TIMEOUT", "forever"},
		{"RUN_SWEEP_INTERVAL", "0"},
		{"RUN_SWEEP_INTERVAL", "10ms"},
		{"RUN_SWEEP_INTERVAL", "-5s"},
		{"RUN_POLL_INTERVAL", "0"},
		{"RUN_POLL_INTERVAL", "100us"},
		{"RUN_REDELIVER_AFTER", "0"},
		{"RUN_REDELIVER_AFTER", "50ms"},
		{"RUN_REDELIVER_AFTER", "later"},
		{"RUN_MAX_RETRY", "often"},
		{"WORKER_METRICS_ADDR", "9091"},
		{"WORKER_METRICS_ADDR", "127.0.0.1:"},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			c, err := config.Load(env(map[string]string{tt.name: tt.value}))
			require.Error(t, err)
			var ce *config.Error
			require.True(t, errors.As(err, &ce), "want *config.Error, got %T: %v", err, err)
			if tt.name == "DATABASE_POOLER" && tt.value == "transaction" {
				require.Equal(t, "DATABASE_DIRECT_URL", ce.Var, "the pooler needs the direct URL")
				require.Contains(t, err.Error(), "DATABASE_POOLER=transaction")
				return
			}
			require.Equal(t, tt.name, ce.Var)
			require.NotEmpty(t, ce.Problem)
			require.Contains(t, err.Error(), tt.name)
			require.NotContains(t, err.Error(), "\n", "the message is one line")
			require.Equal(t, config.Config{}, c, "a failed Load returns the zero Config")
		})
	}
}

// RUN_HEARTBEAT is checked against the RUN_LEASE it is given with, and the
// error names RUN_HEARTBEAT and the lease.
func TestHeartbeatShorterThanLease(t *testing.T) {
	t.Parallel()
	_, err := config.Load(env(map[string]string{"RUN_LEASE": "2s", "RUN_HEARTBEAT": "2s"}))
	var ce *config.Error
	require.True(t, errors.As(err, &ce), "got %v", err)
	require.Equal(t, "RUN_HEARTBEAT", ce.Var)
	require.Equal(t, `config: RUN_HEARTBEAT="2s": must be shorter than RUN_LEASE (2s)`, err.Error())

	c, err := config.Load(env(map[string]string{"RUN_LEASE": "2s", "RUN_HEARTBEAT": "1999ms"}))
	require.NoError(t, err)
	require.Equal(t, 1999*time.Millisecond, c.RunHeartbeat)
}

func TestFirstErrorWins(t *testing.T) {
	t.Parallel()
	_, err := config.Load(env(map[string]string{"LOG_LEVEL": "loud", "IDEMPOTENCY_TTL": "abc"}))
	var ce *config.Error
	require.True(t, errors.As(err, &ce), "got %v", err)
	// Load reads in Vars order: IDEMPOTENCY_TTL comes before LOG_LEVEL.
	require.Equal(t, "IDEMPOTENCY_TTL", ce.Var)
	require.Equal(t, "abc", ce.Value)
}

func TestErrorMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  config.Error
		want string
	}{
		{config.Error{Var: "IDEMPOTENCY_TTL", Value: "abc", Problem: "must be a duration"}, `config: IDEMPOTENCY_TTL="abc": must be a duration`},
		{config.Error{Var: "DATABASE_URL", Problem: "connection refused"}, `config: DATABASE_URL: connection refused`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, tt.err.Error())
		})
	}
}

// FromEnv reads the process environment, so this test cannot be parallel.
func TestFromEnv(t *testing.T) {
	for _, v := range config.Vars {
		t.Setenv(v.Name, "")
	}
	t.Setenv("IDEMPOTENCY_TTL", "2h")
	c, err := config.FromEnv()
	require.NoError(t, err)
	want := documented
	want.IdempotencyTTL = 2 * time.Hour
	if d := cmp.Diff(want, c); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}

	t.Setenv("MAX_BODY_BYTES", "-1")
	_, err = config.FromEnv()
	var ce *config.Error
	require.True(t, errors.As(err, &ce), "got %v", err)
	require.Equal(t, "MAX_BODY_BYTES", ce.Var)
	require.True(t, strings.Contains(err.Error(), "MAX_BODY_BYTES"))
}
