package handlers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
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
// the start is admitted without the limit (fail open), except a start of
// an organisation known to be over its rate while Redis is only late
// (estimate). Starts do not need Redis (the sweeper delivers their runs),
// and the limit must not make them need it.
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

// rateLimitHoldMax is how many refused starts one process holds at once
// (RATE_LIMIT_HOLD) unless Deps.RateLimitHoldMax says otherwise; past it a
// refusal is answered at once. A held one keeps its connection and a
// goroutine, its body already read and dropped.
const rateLimitHoldMax = 1024

// rateLimiter admits an organisation's starts at its rate: a GCRA token
// bucket per organisation in Redis (go-redis/redis_rate), so every API
// process shares it. The burst is one second's worth: an idle organisation
// may send its rate at once, then its rate per second.
type rateLimiter struct {
	limiter     *redis_rate.Limiter // nil: nothing is limited
	defaultRate int
	timeout     time.Duration
	log         *slog.Logger

	// denied remembers, per organisation, until when no start may pass
	// (orgID -> *denial): tokens only come back with time, so until then
	// every start is refused here, without asking Redis. After it, one
	// start asks Redis while the others of the organisation are refused: a
	// flood costs Redis one call per organisation per token, not one per
	// start that arrives as the denial ends.
	denied sync.Map

	// hold is how long a refusal is held at least before its answer
	// (RATE_LIMIT_HOLD; holdFor draws each one's); holding has room for
	// the refusals one process may hold at once.
	hold    time.Duration
	holding chan struct{}

	pausedUntil atomic.Int64 // unix nanoseconds: the limit is skipped until then
	pausedLate  atomic.Bool  // the pause is Redis's lateness, not its failure (see late)
	// unreachable: the client's last dial to Redis failed (dialWatch). A
	// refused dial reaches a call only as its deadline (go-redis dials,
	// and retries, apart from the call), so a call's timeout alone cannot
	// tell a Redis that is down from one that is slow.
	unreachable atomic.Bool
	loggedAt    atomic.Int64 // unix nanoseconds of the last log line

	decisions *prometheus.CounterVec
	held      prometheus.Gauge
}

// denial is what a process knows of an organisation's bucket at a rate:
// no start passes before until (unix nanoseconds), and whether one of its
// starts is asking Redis now.
type denial struct {
	rate   int
	until  atomic.Int64
	asking atomic.Bool
}

func newDenial(rate int, until time.Time) *denial {
	d := &denial{rate: rate}
	d.until.Store(until.UnixNano())
	return d
}

func newRateLimiter(rdb redis.UniversalClient, defaultRate int, timeout, hold time.Duration, holdMax int, log *slog.Logger, reg prometheus.Registerer) *rateLimiter {
	l := &rateLimiter{defaultRate: defaultRate, timeout: cmp.Or(timeout, RateLimitTimeout), log: log,
		hold: hold, holding: make(chan struct{}, cmp.Or(holdMax, rateLimitHoldMax)),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_rate_limit_decisions_total",
			Help: "Starts checked against their organisation's rate, by outcome: allowed, limited, estimated (Redis was late, or was skipped after it was, and the organisation was known to be over its rate: the start was one the process's own estimate of the rate let through), or failed_open (Redis failed or was late, or was skipped after it did; the start went ahead unlimited).",
		}, []string{"outcome"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "valruns_rate_limit_held",
			Help: "Starts refused by the rate limit that this process is holding before their 429 (RATE_LIMIT_HOLD; at most 1,024).",
		}),
	}
	if rdb != nil {
		rdb.AddHook(dialWatch{l})
		l.limiter = redis_rate.NewLimiter(rdb)
	}
	reg.MustRegister(l.decisions, l.held)
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
		var known *denial // the organisation's denial at this rate, ended
		if v, ok := l.denied.Load(p.OrgID); ok {
			d := v.(*denial)
			switch until := d.until.Load(); {
			case d.rate != rate: // the organisation's rate changed: forget it
				l.denied.CompareAndDelete(p.OrgID, d)
			case now.UnixNano() < until:
				l.limited(c, rate, time.Unix(0, until))
				return
			default:
				known = d
			}
		}
		if now.UnixNano() < l.pausedUntil.Load() {
			if known != nil && l.pausedLate.Load() {
				l.estimate(c, known, rate)
				return
			}
			l.decisions.WithLabelValues("failed_open").Inc()
			c.Next()
			return
		}
		if known != nil && !known.asking.CompareAndSwap(false, true) {
			// Another start of the organisation is asking Redis whether a
			// token is back; at most one is.
			l.limited(c, rate, now)
			return
		}
		ctx, cancel := context.WithTimeout(c.Request.Context(), l.timeout)
		res, err := l.limiter.Allow(ctx, "valruns:start:"+p.OrgID, redis_rate.PerSecond(rate))
		cancel()
		if err != nil {
			hungUp := c.Request.Context().Err() != nil
			isLate := hungUp || (late(err) && !l.unreachable.Load())
			if !hungUp { // Redis's doing, not the client's
				l.failed(c.Request.Context(), err, isLate)
			}
			if known != nil {
				known.asking.Store(false)
				if isLate {
					l.estimate(c, known, rate)
					return
				}
				l.denied.CompareAndDelete(p.OrgID, known) // Redis failed: fail open
			}
			l.decisions.WithLabelValues("failed_open").Inc()
			c.Next()
			return
		}
		l.remember(p.OrgID, rate, known, res, now)
		if res.Allowed == 0 {
			l.limited(c, rate, now.Add(res.RetryAfter))
			return
		}
		l.decisions.WithLabelValues("allowed").Inc()
		c.Header(HeaderRateLimitPolicy, policyOf(rate))
		c.Header(HeaderRateLimit, fmt.Sprintf("%s;r=%d;t=%d", rateLimitPolicy, res.Remaining, ceilSeconds(res.ResetAfter)))
		c.Next()
	}
}

// remember records what Redis answered for an organisation's start at
// rate, asked at now: until when none passes (after a refusal, or after
// the last token went, for the token's interval at least), or nothing
// (a token is left). known is the denial the start asked for, if any: it
// is updated, or dropped, and no longer asking.
func (l *rateLimiter) remember(org string, rate int, known *denial, res *redis_rate.Result, now time.Time) {
	var until time.Time
	switch {
	case res.Allowed == 0:
		until = now.Add(res.RetryAfter)
	case res.Remaining == 0:
		until = now.Add(time.Second / time.Duration(rate))
	}
	switch {
	case until.IsZero() && known != nil:
		l.denied.CompareAndDelete(org, known)
	case until.IsZero():
	case known != nil:
		known.until.Store(until.UnixNano())
	default:
		l.denied.Store(org, newDenial(rate, until))
	}
	if known != nil {
		known.asking.Store(false)
	}
}

// estimate decides a start of an organisation known to be over its rate
// (d: Redis refused one of its starts, or gave its last token, and has not
// said since that a token is left) while Redis answers too late to be
// asked: the process counts the tokens itself, one start per token
// interval (1/rate), and refuses the others until the next. So a flood
// stays at its rate while Redis is slow, where failing open let all of it
// through, and its runs still start. The count is the process's own: with
// several API processes, the organisation may get its rate from each
// meanwhile.
func (l *rateLimiter) estimate(c *gin.Context, d *denial, rate int) {
	now := time.Now()
	until := d.until.Load()
	if now.UnixNano() < until || !d.until.CompareAndSwap(until, now.Add(time.Second/time.Duration(rate)).UnixNano()) {
		l.limited(c, rate, time.Unix(0, d.until.Load()))
		return
	}
	l.decisions.WithLabelValues("estimated").Inc()
	c.Header(HeaderRateLimitPolicy, policyOf(rate))
	c.Header(HeaderRateLimit, fmt.Sprintf("%s;r=0;t=1", rateLimitPolicy))
	c.Next()
}

// late reports whether a Redis error means that Redis answered too late
// (a timeout, no connection free in time) rather than that it failed (a
// closed connection, an error reply, a failed dial; the caller also checks
// unreachable): a slow Redis is still counting the organisation's tokens,
// so what the process knew of them holds.
func late(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// dialWatch is the rate limit's hook on its Redis client: it records
// whether the last dial failed (rateLimiter.unreachable).
type dialWatch struct{ l *rateLimiter }

func (w dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		w.l.unreachable.Store(err != nil)
		return conn, err
	}
}

func (dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// limited answers 429 rate_limited: no start passes before until. The
// answer is held first (holdBack); Retry-After counts from the answer.
func (l *rateLimiter) limited(c *gin.Context, rate int, until time.Time) {
	l.decisions.WithLabelValues("limited").Inc()
	discardBody(c)
	l.holdBack(c)
	secs := ceilSeconds(time.Until(until))
	c.Header(HeaderRateLimitPolicy, policyOf(rate))
	c.Header(HeaderRateLimit, fmt.Sprintf("%s;r=0;t=%d", rateLimitPolicy, secs))
	c.Header("Retry-After", strconv.Itoa(secs))
	problem.Abort(c, http.StatusTooManyRequests, problem.RateLimited, fmt.Sprintf(
		"The organisation may start %d runs per second; nothing was done or stored. Retry after Retry-After seconds, with the same Idempotency-Key.", rate))
}

// holdBack holds a refused start for holdFor, or until its client hangs
// up, when the process has room to hold one more: a client that retries a
// refusal at once, whatever Retry-After says, waits all the same, so a
// flood of refused starts sends a few per connection per second rather
// than as many as the CPU can answer. The request gives its room under
// MAX_REQUESTS_IN_FLIGHT back first: a flood held here keeps no other
// request out.
func (l *rateLimiter) holdBack(c *gin.Context) {
	if l.hold <= 0 {
		return
	}
	select {
	case l.holding <- struct{}{}:
	default:
		return // as many held as the process may hold: answered at once
	}
	defer func() { <-l.holding }()
	leaveAdmission(c)
	l.held.Inc()
	defer l.held.Dec()
	t := time.NewTimer(l.holdFor())
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.Request.Context().Done():
	}
}

// holdFor is how long one refusal is held: between RATE_LIMIT_HOLD and
// twice it, at random. With one fixed hold, the clients of a flood that
// were refused together all came back together, the next tokens went to a
// burst of them at once (about rate x hold starts: 25 at the defaults,
// four times a second), and another organisation's start that arrived with
// a burst waited behind it. Spread, they come back one by one, and so do
// the starts that pass. Still at least RATE_LIMIT_HOLD: a client that
// retries at once sends at most 1/RATE_LIMIT_HOLD starts a second per
// connection.
func (l *rateLimiter) holdFor() time.Duration {
	return l.hold + rand.N(l.hold)
}

// policyOf is the RateLimit-Policy of a rate: rate starts per 1-second window.
func policyOf(rate int) string { return fmt.Sprintf("%s;q=%d;w=1", rateLimitPolicy, rate) }

// failed pauses the limit after a Redis failure (isLate: Redis answered
// too late, see late) and logs it, at most once per rateLimitLogEvery.
func (l *rateLimiter) failed(ctx context.Context, err error, isLate bool) {
	now := time.Now()
	l.pausedLate.Store(isLate)
	l.pausedUntil.Store(now.Add(rateLimitPause).UnixNano())
	last := l.loggedAt.Load()
	if now.UnixNano()-last < int64(rateLimitLogEvery) || !l.loggedAt.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	if isLate {
		l.log.WarnContext(ctx, "start rate limit: Redis is late, starts go ahead unlimited meanwhile, except those of organisations known to be over their rate, let through at their rate by this process's estimate (see valruns_rate_limit_decisions_total{outcome=~\"failed_open|estimated\"})",
			"error", "no answer within "+l.timeout.String())
		return
	}
	reason := err.Error()
	if l.unreachable.Load() {
		reason = "cannot connect (the last dial failed)"
	}
	l.log.WarnContext(ctx, "start rate limit: Redis failed, starts go ahead unlimited meanwhile (see valruns_rate_limit_decisions_total{outcome=\"failed_open\"})",
		"error", reason)
}

// ceilSeconds is d in whole seconds, rounded up, at least 1.
func ceilSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}
