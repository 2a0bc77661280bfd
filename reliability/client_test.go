package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// This file is the suite's own retrying client, written as a careful user of
// the API would write one (the client/ package is not used, so the suite
// judges the service alone): one Idempotency-Key per logical operation, the
// same key and body on every retry, exponential backoff with jitter,
// Retry-After honoured, until a definitive answer or a bounded number of
// attempts.

// answer is one HTTP response as the client read it.
type answer struct {
	Status int
	Header http.Header
	Body   []byte
	// Oversized: the body was longer than the client's read cap (it was cut).
	Oversized bool
}

// isProblem reports whether the answer is an RFC 9457 problem document.
func (a *answer) isProblem() bool {
	mt, _, _ := mime.ParseMediaType(a.Header.Get("Content-Type"))
	return mt == "application/problem+json"
}

// code is the problem document's code, "" when there is none.
func (a *answer) code() string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(a.Body, &p)
	return p.Code
}

// replayed reports Idempotent-Replayed: true.
func (a *answer) replayed() bool { return a.Header.Get("Idempotent-Replayed") == "true" }

// attempt is what one HTTP request of an operation got.
type attempt struct {
	At      time.Time
	Replica int
	Status  int    // 0: no answer (network error)
	Err     string // the network error
	// RetryAfter is the header's value, "" when absent.
	RetryAfter string
	Problem    bool
	Code       string
	Replayed   bool
}

// serverError is a 5xx one request got, for the scenario to judge whether
// it was an expected one (such as a 503 with Retry-After while PostgreSQL
// is down).
type serverError struct {
	At         time.Time
	Replica    int
	Status     int
	RetryAfter string
	Problem    bool
	Code       string
	Path       string
}

// recorder counts a scenario's HTTP traffic.
type recorder struct {
	requests atomic.Int64
	mu       sync.Mutex
	errs5xx  []serverError
	answers  []time.Time // when each answered request (any status) ended
}

func (r *recorder) observe(path string, at attempt) {
	r.requests.Add(1)
	if at.Status == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answers = append(r.answers, at.At)
	if at.Status >= 500 {
		r.errs5xx = append(r.errs5xx, serverError{At: at.At, Replica: at.Replica, Status: at.Status,
			RetryAfter: at.RetryAfter, Problem: at.Problem, Code: at.Code, Path: path})
	}
}

// answeredSince counts the requests answered (with any status) after t.
func (r *recorder) answeredSince(t time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.answers {
		if a.After(t) {
			n++
		}
	}
	return n
}

func (r *recorder) serverErrors() []serverError {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]serverError(nil), r.errs5xx...)
}

// request is one logical operation's HTTP request, sent identically on
// every retry.
type request struct {
	Method, Path string
	Key          string // Idempotency-Key; "" sends none
	Body         string
	Token        string
	Header       map[string]string
}

// outcome is how a logical operation ended.
type outcome struct {
	Final      *answer // the last answer (nil: never answered)
	Definitive bool    // Final is definitive: 2xx, or a 4xx not worth retrying
	Attempts   []attempt
}

// client sends requests to the API replicas with retries.
type client struct {
	hc          *http.Client
	bases       []string
	rec         *recorder
	maxAttempts int
	backoff     time.Duration // first retry's delay
	maxBackoff  time.Duration
	maxRetryAft time.Duration // Retry-After is honoured up to this
	readCap     int64         // a body longer than this is cut and flagged
}

func newClient(bases []string, rec *recorder, maxBody int64) *client {
	tr := &http.Transport{
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 128,
		IdleConnTimeout:     30 * time.Second,
	}
	return &client{
		hc:          &http.Client{Transport: tr, Timeout: 20 * time.Second},
		bases:       bases,
		rec:         rec,
		maxAttempts: 25,
		backoff:     50 * time.Millisecond,
		maxBackoff:  2 * time.Second,
		maxRetryAft: 3 * time.Second,
		readCap:     4 * maxBody,
	}
}

func (c *client) close() { c.hc.CloseIdleConnections() }

// retryable says whether an answer is worth retrying: 5xx, 409 (the first
// request with the key is in flight) and 429 with Retry-After. Any other
// answer is definitive: retrying returns the same stored answer.
func retryable(a *answer) bool {
	switch {
	case a.Status >= 500:
		return true
	case a.Status == http.StatusConflict:
		return true
	case a.Status == http.StatusTooManyRequests && a.Header.Get("Retry-After") != "":
		return true
	}
	return false
}

// do sends req until a definitive answer or maxAttempts. The first attempt
// goes to replica first, each retry to the next one, so a dead replica is
// failed over from at once.
func (c *client) do(ctx context.Context, req request, first int) outcome {
	var out outcome
	for n := 0; n < c.maxAttempts; n++ {
		replica := (first + n) % len(c.bases)
		a, at := c.once(ctx, req, replica)
		out.Attempts = append(out.Attempts, at)
		if a != nil {
			out.Final = a
			if !retryable(a) {
				out.Definitive = true
				return out
			}
		}
		if ctx.Err() != nil {
			return out
		}
		d := min(c.maxBackoff, c.backoff<<min(n, 20))
		d = d/2 + rand.N(d/2+1) // jitter: [d/2, d]
		if a != nil {
			if s, err := strconv.Atoi(strings.TrimSpace(a.Header.Get("Retry-After"))); err == nil && s > 0 {
				d = max(d, min(time.Duration(s)*time.Second, c.maxRetryAft))
			}
		}
		select {
		case <-ctx.Done():
			return out
		case <-time.After(d):
		}
	}
	return out
}

// once sends one HTTP request to a replica.
func (c *client) once(ctx context.Context, req request, replica int) (*answer, attempt) {
	at := attempt{Replica: replica}
	var body io.Reader
	if req.Body != "" || req.Method == http.MethodPost {
		body = strings.NewReader(req.Body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.Method, c.bases[replica]+req.Path, body)
	if err != nil {
		at.At, at.Err = time.Now(), err.Error()
		c.rec.observe(req.Path, at)
		return nil, at
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if req.Token != "" {
		hr.Header.Set("Authorization", "Bearer "+req.Token)
	}
	if req.Key != "" {
		hr.Header.Set("Idempotency-Key", req.Key)
	}
	for k, v := range req.Header {
		hr.Header.Set(k, v)
	}
	a, err := c.send(hr)
	at.At = time.Now()
	if err != nil {
		at.Err = err.Error()
		c.rec.observe(req.Path, at)
		return nil, at
	}
	at.Status, at.RetryAfter, at.Problem, at.Replayed = a.Status, a.Header.Get("Retry-After"), a.isProblem(), a.replayed()
	if at.Problem {
		at.Code = a.code()
	}
	c.rec.observe(req.Path, at)
	return a, at
}

// send does one round trip and reads at most readCap bytes of the body.
func (c *client) send(hr *http.Request) (*answer, error) {
	resp, err := c.hc.Do(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(resp.Body, c.readCap+1))
	if err != nil {
		return nil, err
	}
	a := &answer{Status: resp.StatusCode, Header: resp.Header, Body: buf.Bytes()}
	if n > c.readCap {
		a.Oversized = true
		a.Body = a.Body[:c.readCap]
	}
	return a, nil
}
