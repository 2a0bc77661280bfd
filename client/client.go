// Package client is the Go client of the valruns API. It exists so that
// callers get the idempotency promise without re-learning its rules: every
// write sends ONE Idempotency-Key per logical call, with the identical body,
// on all of that call's retries; it retries exactly the answers that are
// safe to retry, honouring Retry-After; and it turns every other answer into
// a typed *Error carrying the problem document. Which answers those are is
// the API's rule, written once in docs/api.md ("Retry advice for clients",
// https://github.com/valruns/valruns/blob/main/docs/api.md#retry-advice-for-clients);
// how this client applies it is in docs/client.md.
//
// It is a module of its own (go get github.com/valruns/valruns/client; Go
// 1.25 or later) and uses only the standard library, so a program embedding it
// does not pull in the server's dependencies (Gin, GORM, pgx, asynq).
package client

import (
	"bytes"
	"cmp"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Header names of the idempotency protocol.
const (
	HeaderKey               = "Idempotency-Key"
	HeaderReplayed          = "Idempotent-Replayed"
	HeaderOriginalRequestID = "Original-Request-Id"
	HeaderRequestID         = "X-Request-Id"
	HeaderPrefer            = "Prefer"
	// HeaderPreferenceApplied is on an answer that honoured `Prefer: wait`.
	HeaderPreferenceApplied = "Preference-Applied"
)

// Defaults of the options.
const (
	DefaultMaxAttempts   = 5
	DefaultBackoffBase   = 250 * time.Millisecond
	DefaultBackoffMax    = 8 * time.Second
	DefaultMaxRetryAfter = 30 * time.Second
	DefaultUserAgent     = "valruns-go-client/1"
	// DefaultTimeout bounds one attempt when no http.Client is given.
	DefaultTimeout = 60 * time.Second
)

// maxResponseBytes bounds an answer read into memory: the server's stored
// answers are far smaller, so anything larger is not the API.
const maxResponseBytes = 64 << 20

// Client calls the valruns API. It is safe for concurrent use.
type Client struct {
	base          string // without a trailing slash
	baseErr       error
	token         string
	hc            *http.Client
	maxAttempts   int
	backoffBase   time.Duration
	backoffMax    time.Duration
	maxRetryAfter time.Duration
	userAgent     string
	log           *slog.Logger
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the http.Client (its Timeout bounds each attempt);
// nil keeps the default, which has a 60 s timeout.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = cmp.Or(hc, c.hc) } }

// WithMaxAttempts sets how many requests one call may send, the first
// included (1 = never retry); n < 1 keeps the default, 5.
func WithMaxAttempts(n int) Option {
	return func(c *Client) {
		if n >= 1 {
			c.maxAttempts = n
		}
	}
}

// WithBackoff sets the bounds of the exponential backoff: the wait before
// retry n is uniformly random in [0, min(max, base*2^(n-1))) ("full
// jitter"). A value <= 0 keeps its default (250 ms, 8 s).
func WithBackoff(base, max time.Duration) Option {
	return func(c *Client) {
		if base > 0 {
			c.backoffBase = base
		}
		if max > 0 {
			c.backoffMax = max
		}
	}
}

// WithMaxRetryAfter caps how long a Retry-After from the server can make a
// call wait before its next attempt; d <= 0 keeps the default, 30 s.
func WithMaxRetryAfter(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.maxRetryAfter = d
		}
	}
}

// WithUserAgent sets the User-Agent header; "" keeps the default.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = cmp.Or(ua, c.userAgent) }
}

// WithLogger receives one line per retry (Info) with the cause and the wait;
// nil discards.
func WithLogger(l *slog.Logger) Option { return func(c *Client) { c.log = cmp.Or(l, c.log) } }

// New returns a client of the API at baseURL (such as
// http://127.0.0.1:8080) acting with the API token token. A malformed
// baseURL is reported by every call.
func New(baseURL, token string, opts ...Option) *Client {
	c := &Client{
		base:          strings.TrimRight(baseURL, "/"),
		token:         token,
		hc:            &http.Client{Timeout: DefaultTimeout},
		maxAttempts:   DefaultMaxAttempts,
		backoffBase:   DefaultBackoffBase,
		backoffMax:    DefaultBackoffMax,
		maxRetryAfter: DefaultMaxRetryAfter,
		userAgent:     DefaultUserAgent,
		log:           slog.New(slog.DiscardHandler),
	}
	if err := CheckBaseURL(baseURL); err != nil {
		c.baseErr = fmt.Errorf("valruns: base URL %q: %w", baseURL, err)
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// CheckBaseURL reports what is wrong with a base URL that New would refuse
// (every call of its Client would then fail without sending anything): it
// must be http:// or https://, with a host, and no query or fragment. A
// path is kept as a prefix of every route (an API behind a proxy).
func CheckBaseURL(baseURL string) error {
	const want = "want http://host[:port] or https://host[:port], such as http://127.0.0.1:8080"
	if !strings.Contains(baseURL, "://") {
		return errors.New("no scheme: " + want)
	}
	u, err := url.Parse(baseURL)
	switch {
	case err != nil:
		return fmt.Errorf("not a URL (%v): %s", errors.Unwrap(err), want)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("scheme %q: %s", u.Scheme, want)
	case u.Host == "":
		return errors.New("no host: " + want)
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return errors.New("a base URL has no ?query or #fragment: " + want)
	}
	return nil
}

// NewKey returns a new random idempotency key (a UUIDv4 from crypto/rand).
// Keep it with the operation it names (in a database row, a job) when the
// operation must survive the process: a later StartRun with WithKey(key)
// then replays the first answer instead of starting again.
func NewKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // never fails (Go 1.24+: it crashes the program instead)
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// response is one answer read in full.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends method path with body (nil: none) and the extra headers,
// retrying what is safe to retry, and returns the first 2xx answer and the
// number of attempts it took. Every attempt sends the same bytes: the body
// is buffered once and re-read through the request's GetBody.
func (c *Client) do(ctx context.Context, method, path string, body []byte, hdr http.Header) (*response, int, error) {
	if c.baseErr != nil {
		return nil, 0, c.baseErr
	}
	// wrote: some attempt's request went out on a connection. net/http
	// itself may resend a request that has an Idempotency-Key on a fresh
	// connection, so an attempt's own error does not tell.
	var wrote atomic.Bool
	traced := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) }})
	tmpl, err := c.newRequest(traced, method, path, body, hdr)
	if err != nil {
		return nil, 0, err
	}

	sent := false // some attempt may have reached the server
	for attempt := 1; ; attempt++ {
		resp, err := c.once(tmpl)
		sent = sent || err == nil || wrote.Load() || !beforeSending(err)
		var (
			cause      error
			retryAfter time.Duration
			hasRA      bool
		)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, attempt, &RetryError{Attempts: attempt, Last: err, Ctx: ctx.Err(), NotSent: !sent}
		case err != nil:
			if permanent(err) {
				return nil, attempt, err
			}
			cause = err
		case resp.status >= 200 && resp.status < 300:
			return resp, attempt, nil
		default:
			perr := errorOf(resp)
			if !retryable(perr) {
				return nil, attempt, perr
			}
			cause = perr
			retryAfter, hasRA = parseRetryAfter(resp.header.Get("Retry-After"), time.Now())
		}
		if attempt >= c.maxAttempts {
			return nil, attempt, &RetryError{Attempts: attempt, Last: cause, NotSent: !sent}
		}
		wait := c.backoff(attempt, retryAfter, hasRA)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			// Sleeping would only end in the deadline: say so now.
			return nil, attempt, &RetryError{Attempts: attempt, Last: cause, Ctx: context.DeadlineExceeded, NotSent: !sent}
		}
		c.log.InfoContext(ctx, "valruns: retrying", "method", method, "path", path, "attempt", attempt,
			"wait", wait, "cause", cause.Error(), "idempotency_key", hdr.Get(HeaderKey))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, attempt, &RetryError{Attempts: attempt, Last: cause, Ctx: ctx.Err(), NotSent: !sent}
		case <-t.C:
		}
	}
}

// newRequest is the request every attempt of do clones: body (nil: none),
// the caller's headers and the client's own. A header net/http would refuse
// is an error here, once, instead of on every attempt.
func (c *Client) newRequest(ctx context.Context, method, path string, body []byte, hdr http.Header) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	tmpl, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("valruns: %w", err)
	}
	for k, v := range hdr {
		tmpl.Header[k] = v
	}
	if c.token != "" {
		tmpl.Header.Set("Authorization", "Bearer "+c.token)
	}
	tmpl.Header.Set("User-Agent", c.userAgent)
	tmpl.Header.Set("Accept", "application/json, application/problem+json")
	if body != nil {
		tmpl.Header.Set("Content-Type", "application/json")
	}
	for name, vs := range tmpl.Header {
		for _, v := range vs {
			if !validHeaderValue(v) {
				return nil, fmt.Errorf("valruns: the %s header holds a control character", name)
			}
		}
	}
	return tmpl, nil
}

// validHeaderValue reports whether net/http will send v: no control
// characters other than tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// once sends one attempt of tmpl and reads the whole answer: an answer cut
// short is a network error like any other.
func (c *Client) once(tmpl *http.Request) (*response, error) {
	req := tmpl.Clone(tmpl.Context())
	if tmpl.GetBody != nil {
		b, err := tmpl.GetBody()
		if err != nil {
			return nil, err
		}
		req.Body = b
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("valruns: reading the answer to %s %s: %w", req.Method, req.URL.Path, err)
	}
	if len(b) > maxResponseBytes {
		return nil, &permanentError{fmt.Errorf("valruns: the answer to %s %s exceeds %d bytes", req.Method, req.URL.Path, maxResponseBytes)}
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// beforeSending reports whether a transport error happened before the
// request could leave: no connection was made (refused, unreachable, no
// such host).
func beforeSending(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.As(err, &op) && op.Op == "dial"
}

// permanentError is a failure that another attempt would only repeat.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// permanent reports whether a transport error would recur on a retry: a
// certificate that does not verify, or an answer too large to be the API.
// Everything else (refused, reset, timed out, cut short) may be transient,
// and the same Idempotency-Key makes a retry safe even when the server did
// process the request.
func permanent(err error) bool {
	var pe *permanentError
	var cv *tls.CertificateVerificationError
	return errors.As(err, &pe) || errors.As(err, &cv)
}

// retryable reports whether an error answer may succeed later: 409 in
// progress, 5xx, and 429 except the stored quota_exceeded and
// test_events_pending.
func retryable(e *Error) bool {
	switch {
	case e.Status == http.StatusConflict:
		return e.Code == CodeKeyInProgress
	case e.Status == http.StatusTooManyRequests:
		return e.Code != CodeQuotaExceeded && e.Code != CodeTestEventsPending
	case e.Status >= 500:
		return true
	}
	return false
}

// backoff is the wait before the attempt after attempt: the server's
// Retry-After when it sent one (capped, plus up to one base of jitter so
// clients told the same second do not return together), else full jitter
// over base*2^(attempt-1) capped at max.
func (c *Client) backoff(attempt int, retryAfter time.Duration, hasRA bool) time.Duration {
	if hasRA {
		return min(retryAfter, c.maxRetryAfter) + rand.N(c.backoffBase)
	}
	ceil := c.backoffMax
	if shift := attempt - 1; shift < 62 && c.backoffBase <= c.backoffMax>>shift {
		ceil = c.backoffBase << shift
	}
	return rand.N(ceil)
}

// parseRetryAfter reads Retry-After as delay-seconds or an HTTP-date
// (RFC 9110 §10.2.3).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, 1<<20)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// errorOf builds the *Error of a non-2xx answer.
func errorOf(r *response) *Error {
	e := &Error{}
	if err := json.Unmarshal(r.body, e); err != nil || (e.Code == "" && e.Detail == "") {
		e = &Error{Detail: snippet(r.body)}
	}
	e.Status = r.status
	e.Title = cmp.Or(e.Title, http.StatusText(r.status))
	e.RequestID = cmp.Or(e.RequestID, r.header.Get(HeaderRequestID))
	e.Replayed = r.header.Get(HeaderReplayed) == "true"
	return e
}

// snippet is the start of a non-problem body on one line.
func snippet(b []byte) string {
	const n = 200
	s := string(b)
	if len(s) > n {
		s = s[:n] + "..."
	}
	return strings.Join(strings.Fields(strings.ToValidUTF8(s, "?")), " ")
}

// get reads path into v, retrying like any call, and returns the answer's
// body.
func (c *Client) get(ctx context.Context, path string, v any) ([]byte, error) {
	resp, err := c.getWith(ctx, path, nil, v)
	if err != nil {
		return nil, err
	}
	return resp.body, nil
}

// getWith is get with request headers, returning the whole answer.
func (c *Client) getWith(ctx context.Context, path string, hdr http.Header, v any) (*response, error) {
	resp, _, err := c.do(ctx, http.MethodGet, path, nil, hdr)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(resp.body, v); err != nil {
		return nil, fmt.Errorf("valruns: decode the answer to GET %s: %w", path, err)
	}
	return resp, nil
}
