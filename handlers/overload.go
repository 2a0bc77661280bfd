package handlers

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/valruns/valruns/problem"
)

// admission bounds what one API process holds at once: a count of
// requests and a byte budget of request bodies. A request that finds no
// room waits at most wait (in order of arrival), then answers 503
// overloaded with Retry-After: memory and queueing stay bounded however
// many clients send at once. Each body is counted by its Content-Length
// (at most maxBody, which the body limit enforces), or maxBody when its
// length is unknown (chunked, or gzip, which is counted decoded).
type admission struct {
	requests *semaphore.Weighted // nil: no bound
	bytes    *semaphore.Weighted // nil: no bound
	budget   int64
	maxBody  int64
	wait     time.Duration

	inFlight      prometheus.Gauge
	bytesInFlight prometheus.Gauge
	refused       *prometheus.CounterVec
}

func newAdmission(maxRequests int, maxBytes, maxBody int64, wait time.Duration, reg prometheus.Registerer) *admission {
	a := &admission{
		budget: maxBytes, maxBody: maxBody, wait: wait,
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "valruns_http_requests_in_flight",
			Help: "/api/ requests this process is serving (bounded by MAX_REQUESTS_IN_FLIGHT).",
		}),
		bytesInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "valruns_http_body_bytes_in_flight",
			Help: "Request body bytes admitted and not yet answered (bounded by MAX_BODY_BYTES_IN_FLIGHT).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_http_overloaded_total",
			Help: "Requests answered 503 overloaded, by the bound they found full (requests, body_bytes).",
		}, []string{"bound"}),
	}
	for _, bound := range []string{"requests", "body_bytes"} {
		a.refused.WithLabelValues(bound) // exported from the start, at 0
	}
	if maxRequests > 0 {
		a.requests = semaphore.NewWeighted(int64(maxRequests))
	}
	if maxBytes > 0 {
		a.bytes = semaphore.NewWeighted(maxBytes)
	}
	reg.MustRegister(a.inFlight, a.bytesInFlight, a.refused)
	return a
}

// admissionKey holds, in the gin context of an admitted request, the func
// that gives its room back (see leaveAdmission).
const admissionKey = "valruns.admission.release"

// middleware admits a request into the bounds, or answers 503 overloaded.
func (a *admission) middleware() gin.HandlerFunc {
	return func(c *gin.Context) {
		n := a.bodyWeight(c.Request)
		if full := a.admit(c.Request.Context(), n); full != "" {
			a.refuse(c, full)
			return
		}
		release := sync.OnceFunc(func() { a.release(n) })
		c.Set(admissionKey, release)
		defer release()
		c.Next()
	}
}

// leaveAdmission gives the request's room under MAX_REQUESTS_IN_FLIGHT and
// MAX_BODY_BYTES_IN_FLIGHT back before it is answered: for a request about
// to wait a long while holding nothing else (a long-poll), which would
// otherwise keep other requests out for as long. It may be called more than
// once, and on a request the bounds never admitted.
func leaveAdmission(c *gin.Context) {
	if release, ok := c.Value(admissionKey).(func()); ok {
		release()
	}
}

// admit takes a request slot and n bytes of the budget, waiting up to
// a.wait for them; it returns the bound it found full ("" when admitted,
// holding nothing otherwise).
func (a *admission) admit(ctx context.Context, n int64) (full string) {
	ctx, cancel := a.waitContext(ctx)
	defer cancel()
	if a.requests != nil && !acquire(ctx, a.requests, 1, a.wait) {
		return "requests"
	}
	if a.bytes != nil && n > 0 && !acquire(ctx, a.bytes, n, a.wait) {
		if a.requests != nil {
			a.requests.Release(1)
		}
		return "body_bytes"
	}
	a.inFlight.Inc()
	a.bytesInFlight.Add(float64(n))
	return ""
}

// release gives back what admit took.
func (a *admission) release(n int64) {
	a.inFlight.Dec()
	a.bytesInFlight.Sub(float64(n))
	if a.bytes != nil && n > 0 {
		a.bytes.Release(n)
	}
	if a.requests != nil {
		a.requests.Release(1)
	}
}

// waitContext bounds the wait for room by a.wait and the client's hang-up.
func (a *admission) waitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if a.wait <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, a.wait)
}

// acquire takes n of s: at once when there is room, else waiting until ctx
// ends (never, when wait is 0).
func acquire(ctx context.Context, s *semaphore.Weighted, n int64, wait time.Duration) bool {
	if s.TryAcquire(n) {
		return true
	}
	if wait <= 0 {
		return false
	}
	return s.Acquire(ctx, n) == nil
}

// bodyWeight is what the request's body counts against the byte budget.
func (a *admission) bodyWeight(r *http.Request) int64 {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return 0
	}
	n := r.ContentLength
	if n < 0 || n > a.maxBody {
		// Unknown (chunked, or gzip counted decoded): it may be read up
		// to the limit. Over the limit: it is read to the limit, then 413.
		n = a.maxBody
	}
	return min(n, a.budget) // never more than the whole budget, or it could never enter
}

func (a *admission) refuse(c *gin.Context, bound string) {
	a.refused.WithLabelValues(bound).Inc()
	what := "requests"
	if bound == "body_bytes" {
		what = "request body bytes"
	}
	discardBody(c)
	c.Header("Retry-After", "1")
	problem.Abort(c, http.StatusServiceUnavailable, problem.Overloaded,
		fmt.Sprintf("The server is serving as many %s as it may at once; nothing was done. Retry after Retry-After seconds, with the same Idempotency-Key.", what))
}

// discardBody reads and drops what is left of the request's body before an
// answer that did not need it: net/http closes a connection that leaves
// more than 256 KB of a body unread, and a client still sending would meet
// a reset, often before it reads the answer. limitBody calls it after
// every request; 503 overloaded and 429 rate_limited call it before they
// answer (a held 429 sees its client hang up only once its body is read).
// The body limit (limitBody) bounds the read at
// MAX_BODY_BYTES, and nothing is kept in memory. A client that waits for
// `100 Continue` is not invited to send: the answer goes at once, and the
// connection closes after it.
func discardBody(c *gin.Context) {
	r := c.Request
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	if strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		c.Header("Connection", "close")
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
}
