package handlers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-redis/redis_rate/v10"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/problem"
)

// RateLimitTimeout bounds the rate limit's round trip to Redis (unless
// Deps.RateLimitTimeout says otherwise): past it, or on any Redis error,
// the start is admitted without the limit (fail open). Starts do not need
// Redis (the sweeper delivers their runs), and the limit must not make them
// need it.
const RateLimitTimeout = 250 * time.Millisecond

// rateLimitPause is how long a process skips the limit after Redis failed
// it, so that an unreachable or hung Redis costs one start per second the
// timeout, not every start.
const rateLimitPause = time.Second

// rateLimitLogEvery spaces the log lines of a failing limit.
const rateLimitLogEvery = time.Minute

// Header names of the rate limit (draft-ietf-httpapi-ratelimit-headers).
const (
	HeaderRateLimitPolicy = "RateLimit-Policy"
	HeaderRateLimit       = "RateLimit"
)

// rateLimitPolicy is the name of the one policy in RateLimit-Policy and
// RateLimit: the organisation's starts per second.
const rateLimitPolicy = `"org"`

// rateLimiter admits an organisation's starts at its rate: a GCRA token
// bucket per organisation in Redis (go-redis/redis_rate), so every API
// process shares it. The burst is one second's worth: an idle organisation
// may send its rate at once, then its rate per second.
type rateLimiter struct {
	limiter     *redis_rate.Limiter // nil: nothing is limited
	defaultRate int
	timeout     time.Duration
	log         *slog.Logger

	// denied remembers, per organisation, until when Redis said no start
	// may pass (orgID -> denial): tokens only come back with time, so until
	// then every start is refused here, without asking Redis again. A flood
	// costs Redis one call per organisation per Retry-After.
	denied sync.Map

	pausedUntil atomic.Int64 // unix nanoseconds: the limit is skipped until then
	loggedAt    atomic.Int64 // unix nanoseconds of the last log line

	decisions *prometheus.CounterVec
}

// denial is a refusal of Redis: no start of the organisation at this rate
// passes before until.
type denial struct {
	rate  int
	until time.Time
}

func newRateLimiter(rdb redis.UniversalClient, defaultRate int, timeout time.Duration, log *slog.Logger, reg prometheus.Registerer) *rateLimiter {
	l := &rateLimiter{defaultRate: defaultRate, timeout: cmp.Or(timeout, RateLimitTimeout), log: log,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_rate_limit_decisions_total",
			Help: "Starts checked against their organisation's rate, by outcome: allowed, limited, or failed_open (Redis failed or was slow, or was skipped after it did; the start went ahead unlimited).",
		}, []string{"outcome"}),
	}
	if rdb != nil {
		l.limiter = redis_rate.NewLimiter(rdb)
	}
	reg.MustRegister(l.decisions)
	return l
}

// middleware limits the route it guards to the organisation's start rate.
// It runs before the idempotency wrapper: a rate_limited answer is not
// stored against the request's key, so the retry executes. Every answer it
// lets through, and its 429, carries RateLimit-Policy and RateLimit.
func (l *rateLimiter) middleware() gin.HandlerFunc {
	return func(c *gin.Context) {
		p := principalOf(c)
		rate := l.defaultRate
		if p.StartRate != nil {
			rate = *p.StartRate
		}
		if rate <= 0 || l.limiter == nil {
			c.Next() // unlimited: no Redis call at all
			return
		}
		now := time.Now()
		if v, ok := l.denied.Load(p.OrgID); ok {
			if d := v.(denial); d.rate == rate && now.Before(d.until) {
				l.limited(c, rate, d.until.Sub(now))
				return
			}
			l.denied.Delete(p.OrgID)
		}
		if now.UnixNano() < l.pausedUntil.Load() {
			l.decisions.WithLabelValues("failed_open").Inc()
			c.Next()
			return
		}
		ctx, cancel := context.WithTimeout(c.Request.Context(), l.timeout)
		res, err := l.limiter.Allow(ctx, "valruns:start:"+p.OrgID, redis_rate.PerSecond(rate))
		cancel()
		if err != nil {
			if c.Request.Context().Err() == nil { // not the client's hang-up
				l.failed(c.Request.Context(), err)
			}
			l.decisions.WithLabelValues("failed_open").Inc()
			c.Next()
			return
		}
		if res.Allowed == 0 {
			l.denied.Store(p.OrgID, denial{rate: rate, until: now.Add(res.RetryAfter)})
			l.limited(c, rate, res.RetryAfter)
			return
		}
		l.decisions.WithLabelValues("allowed").Inc()
		c.Header(HeaderRateLimitPolicy, policyOf(rate))
		c.Header(HeaderRateLimit, fmt.Sprintf("%s;r=%d;t=%d", rateLimitPolicy, res.Remaining, ceilSeconds(res.ResetAfter)))
		c.Next()
	}
}

// limited answers 429 rate_limited: no start passes for wait.
func (l *rateLimiter) limited(c *gin.Context, rate int, wait time.Duration) {
	l.decisions.WithLabelValues("limited").Inc()
	secs := ceilSeconds(wait)
	c.Header(HeaderRateLimitPolicy, policyOf(rate))
	c.Header(HeaderRateLimit, fmt.Sprintf("%s;r=0;t=%d", rateLimitPolicy, secs))
	c.Header("Retry-After", strconv.Itoa(secs))
	discardBody(c)
	problem.Abort(c, http.StatusTooManyRequests, problem.RateLimited, fmt.Sprintf(
		"The organisation may start %d runs per second; nothing was done or stored. Retry after Retry-After seconds, with the same Idempotency-Key.", rate))
}

// policyOf is the RateLimit-Policy of a rate: rate starts per 1-second window.
func policyOf(rate int) string { return fmt.Sprintf("%s;q=%d;w=1", rateLimitPolicy, rate) }

// failed pauses the limit after a Redis failure and logs it, at most once
// per rateLimitLogEvery.
func (l *rateLimiter) failed(ctx context.Context, err error) {
	now := time.Now()
	l.pausedUntil.Store(now.Add(rateLimitPause).UnixNano())
	last := l.loggedAt.Load()
	if now.UnixNano()-last < int64(rateLimitLogEvery) || !l.loggedAt.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	reason := err.Error()
	if errors.Is(err, context.DeadlineExceeded) {
		reason = "no answer within " + l.timeout.String()
	}
	l.log.WarnContext(ctx, "start rate limit: Redis failed, starts go ahead unlimited meanwhile (see valruns_rate_limit_decisions_total{outcome=\"failed_open\"})",
		"error", reason)
}

// ceilSeconds is d in whole seconds, rounded up, at least 1.
func ceilSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}
