package client_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valruns/valruns/client"
)

// These tests need answers the real server cannot be made to give on
// demand (a Retry-After of our choosing, a 403, a proxy's HTML 502), so
// they use a handler of their own that plays a script of answers and
// records what each attempt sent. Everything else is tested against the
// real API in client_test.go.

// answer is one scripted answer.
type answer struct {
	status int
	header map[string]string
	body   string
	// retryAfterIn, when set, sends Retry-After as the HTTP-date this long
	// after the moment of answering.
	retryAfterIn time.Duration
}

// hit is what one attempt sent, when it arrived, and the Retry-After it
// was answered.
type hit struct {
	at         time.Time
	header     http.Header
	body       []byte
	retryAfter string
}

// scripted serves the answers in order (the last one repeats) and records
// the hits.
type scripted struct {
	url string
	mu  sync.Mutex
	ans []answer
	got []hit
}

const runJSON = `{"id":"5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a","workflow_id":"0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a",` +
	`"status":"queued","submission":{"total":1},"metadata":{},"findings":[],"attempts":0,"created_at":"2026-11-22T10:00:00Z"}`

var created = answer{status: 201, header: map[string]string{"Content-Type": "application/json"}, body: runJSON}

func problemAnswer(status int, code string, header ...string) answer {
	h := map[string]string{"Content-Type": "application/problem+json"}
	for i := 0; i+1 < len(header); i += 2 {
		h[header[i]] = header[i+1]
	}
	return answer{status: status, header: h, body: fmt.Sprintf(
		`{"type":"/problems/%s","title":%q,"status":%d,"detail":"scripted","code":%q,"request_id":"r-%d"}`,
		code, http.StatusText(status), status, code, status)}
}

func newScripted(t *testing.T, ans ...answer) *scripted {
	t.Helper()
	s := &scripted{ans: ans}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.got)
		a := s.ans[min(n, len(s.ans)-1)]
		h := hit{at: time.Now(), header: r.Header.Clone(), body: b}
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		if a.retryAfterIn > 0 {
			w.Header().Set("Retry-After", h.at.Add(a.retryAfterIn).UTC().Format(http.TimeFormat))
		}
		h.retryAfter = w.Header().Get("Retry-After")
		s.got = append(s.got, h)
		s.mu.Unlock()
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, a.body)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *scripted) hits() []hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hit(nil), s.got...)
}

// TestRetryAfterHonoured: after a 503, a 429 (not quota_exceeded) or a 409
// with Retry-After, in seconds or as an HTTP-date, the next attempt comes
// no sooner than it says: seconds counted from the moment the server
// answered, a date as it stands. Both are lower bounds the retry meets
// however slow the machine; how much later it comes is not asserted.
func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		first answer
	}{
		{"503 Retry-After: 1", problemAnswer(503, "service_unavailable", "Retry-After", "1")},
		{"429 Retry-After: 1", problemAnswer(429, "rate_limited", "Retry-After", "1")},
		{"409 in progress Retry-After: 1", problemAnswer(409, "idempotency_key_in_progress", "Retry-After", "1")},
		// Made when the server answers: 2 s on, in whole seconds, is at
		// least 1 s away then, however late the first request came.
		{"503 Retry-After: HTTP-date", func() answer {
			a := problemAnswer(503, "service_unavailable")
			a.retryAfterIn = 2 * time.Second
			return a
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newScripted(t, tt.first, created)
			c := client.New(s.url, "vr_x", client.WithBackoff(time.Millisecond, time.Millisecond))
			res, err := c.StartRun(t.Context(), "wf", 1)
			noError(t, err)
			equal(t, 2, res.Attempts)
			h := s.hits()
			hasLen(t, h, 2)
			notBefore := h[0].at.Add(time.Second)
			if tt.first.retryAfterIn > 0 {
				date, err := http.ParseTime(h[0].retryAfter)
				noError(t, err, h[0].retryAfter)
				isTrue(t, date.After(h[0].at), "the date is ahead of the answer: %s vs %s", date, h[0].at)
				notBefore = date
			}
			isFalse(t, h[1].at.Before(notBefore), "the retry came at %s, before %s (Retry-After: %s, answered at %s)",
				h[1].at.Format(time.RFC3339Nano), notBefore.Format(time.RFC3339Nano), h[0].retryAfter, h[0].at.Format(time.RFC3339Nano))
		})
	}
}

// TestRetryAfterCapped: a Retry-After beyond the cap waits the cap, so the
// call succeeds long before the server's hour. (With a broken cap the call
// would fail at once: a wait past the context's deadline is not started.)
func TestRetryAfterCapped(t *testing.T) {
	t.Parallel()
	s := newScripted(t, problemAnswer(503, "service_unavailable", "Retry-After", "3600"), created)
	c := client.New(s.url, "vr_x", client.WithMaxRetryAfter(50*time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := c.StartRun(ctx, "wf", 1)
	noError(t, err)
	equal(t, 2, res.Attempts)

	// Without the cap, the wait would outlive the deadline: the call says so
	// without sleeping.
	s = newScripted(t, problemAnswer(503, "service_unavailable", "Retry-After", "3600"), created)
	c = client.New(s.url, "vr_x", client.WithMaxRetryAfter(2*time.Hour))
	_, err = c.StartRun(ctx, "wf", 1)
	errorIs(t, err, context.DeadlineExceeded)
	var re *client.RetryError
	errorAs(t, err, &re)
	equal(t, 1, re.Attempts)
	hasLen(t, s.hits(), 1)
}

// TestRetriesSendTheSameRequest: every attempt of one call carries the same
// Idempotency-Key and byte-identical body, and the Prefer: wait asked for.
func TestRetriesSendTheSameRequest(t *testing.T) {
	t.Parallel()
	s := newScripted(t, problemAnswer(500, "internal_error"), problemAnswer(502, "bad_gateway"),
		answer{status: 503, body: "<html>\n<body>upstream down</body></html>"}, problemAnswer(409, "idempotency_key_in_progress"), created)
	var logs bytes.Buffer
	var logMu sync.Mutex
	c := client.New(s.url, "vr_secret", client.WithBackoff(time.Millisecond, 2*time.Millisecond),
		client.WithUserAgent("client-test/1"), client.WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))))
	res, err := c.StartRun(t.Context(), "wf-1", map[string]any{"b": 1, "a": []int{1, 2}},
		client.WithMetadata(map[string]string{"source": "test"}), client.WithWait(1500*time.Millisecond))
	noError(t, err)
	equal(t, 5, res.Attempts)
	equal(t, "5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a", res.Run.ID)
	h := s.hits()
	hasLen(t, h, 5)
	for i, x := range h {
		equal(t, res.Key, x.header.Get("Idempotency-Key"), "attempt %d", i+1)
		equal(t, h[0].body, x.body, "attempt %d sent the same bytes", i+1)
		equal(t, "wait=2", x.header.Get("Prefer"), "1.5 s rounds up to 2")
		equal(t, "Bearer vr_secret", x.header.Get("Authorization"))
		equal(t, "client-test/1", x.header.Get("User-Agent"))
		equal(t, "application/json", x.header.Get("Content-Type"))
	}
	var body map[string]json.RawMessage
	noError(t, json.Unmarshal(h[0].body, &body))
	jsonEq(t, `{"a":[1,2],"b":1}`, string(body["submission"]))
	jsonEq(t, `{"source":"test"}`, string(body["metadata"]))
	logMu.Lock()
	equal(t, 4, strings.Count(logs.String(), "valruns: retrying"), logs.String())
	notContains(t, logs.String(), "vr_secret", "the token is never logged")
	logMu.Unlock()

	for _, tt := range []struct {
		wait time.Duration
		want string
	}{{time.Second, "wait=1"}, {time.Millisecond, "wait=1"}, {0, ""}} {
		s := newScripted(t, created)
		_, err := client.New(s.url, "t").StartRun(t.Context(), "wf", 1, client.WithWait(tt.wait))
		noError(t, err)
		equal(t, tt.want, s.hits()[0].header.Get("Prefer"), "WithWait(%s)", tt.wait)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestGivingUp: when the attempts are spent the error says how many and
// wraps the last cause; answers that are final are one attempt.
func TestGivingUp(t *testing.T) {
	t.Parallel()
	fast := []client.Option{client.WithBackoff(time.Millisecond, time.Millisecond), client.WithMaxAttempts(3)}

	s := newScripted(t, problemAnswer(409, "idempotency_key_in_progress", "Retry-After", "0"))
	_, err := client.New(s.url, "t", fast...).StartRun(t.Context(), "wf", 1)
	var re *client.RetryError
	errorAs(t, err, &re)
	equal(t, 3, re.Attempts)
	errorIs(t, err, client.ErrKeyInProgress)
	contains(t, err.Error(), "3 attempts")
	contains(t, err.Error(), "idempotency_key_in_progress")
	hasLen(t, s.hits(), 3)

	s = newScripted(t, answer{status: 502, body: "<html>\r\n<h1>Bad Gateway</h1>\n</html>"})
	_, err = client.New(s.url, "t", fast...).GetRun(t.Context(), "r")
	errorAs(t, err, &re)
	var e *client.Error
	errorAs(t, err, &e)
	equal(t, 502, e.Status)
	equal(t, "<html> <h1>Bad Gateway</h1> </html>", e.Detail)
	notContains(t, err.Error(), "\n")
	hasLen(t, s.hits(), 3, "reads are retried on 5xx too")

	// Nothing listens: network errors are retried, then reported.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	_, err = client.New(dead.URL, "t", fast...).StartRun(t.Context(), "wf", 1)
	errorAs(t, err, &re)
	equal(t, 3, re.Attempts)
	isTrue(t, re.NotSent, "refused: nothing left the client")

	// A server that takes the request and hangs up may have processed it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Read(make([]byte, 1<<16))
			_ = c.Close()
		}
	}()
	_, err = client.New("http://"+ln.Addr().String(), "t", fast...).StartRun(t.Context(), "wf", 1)
	errorAs(t, err, &re)
	equal(t, 3, re.Attempts)
	isFalse(t, re.NotSent, "sent, then hung up on: it may have been processed")
	s = newScripted(t, problemAnswer(503, "service_unavailable", "Retry-After", "0"))
	_, err = client.New(s.url, "t", fast...).StartRun(t.Context(), "wf", 1)
	errorAs(t, err, &re)
	isFalse(t, re.NotSent, "answered")

	for _, tt := range []struct {
		a        answer
		sentinel error
	}{
		{problemAnswer(403, "forbidden"), client.ErrForbidden},
		{problemAnswer(429, "quota_exceeded", "Retry-After", "0"), client.ErrQuotaExceeded},
		{problemAnswer(422, "idempotency_key_reused"), client.ErrKeyReused},
		{problemAnswer(404, "not_found"), client.ErrNotFound},
		{problemAnswer(401, "invalid_token"), client.ErrUnauthorized},
		{problemAnswer(400, "validation_error"), nil},
		{problemAnswer(413, "request_body_too_large"), nil},
	} {
		s := newScripted(t, tt.a)
		_, err := client.New(s.url, "t", fast...).StartRun(t.Context(), "wf", 1)
		errorAs(t, err, &e, tt.a.body)
		equal(t, tt.a.status, e.Status)
		equal(t, fmt.Sprintf("r-%d", tt.a.status), e.RequestID)
		if tt.sentinel != nil {
			errorIs(t, err, tt.sentinel)
		}
		hasLen(t, s.hits(), 1, "%d is final", tt.a.status)
	}

	// A context cancelled while backing off ends the call with its error.
	s = newScripted(t, problemAnswer(503, "service_unavailable", "Retry-After", "30"))
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = client.New(s.url, "t").StartRun(ctx, "wf", 1)
	errorIs(t, err, context.Canceled)
	errorAs(t, err, &re)
	equal(t, 1, re.Attempts)

	// What net/http or the server would refuse on every attempt is refused
	// before the first.
	s = newScripted(t, created)
	_, err = client.New(s.url, "t").StartRun(t.Context(), "wf", 1, client.WithKey("line\nbreak"))
	errorContains(t, err, "printable ASCII")
	_, err = client.New(s.url, "t").StartRun(t.Context(), "wf", 1, client.WithKey("clé"))
	errorContains(t, err, "printable ASCII")
	_, err = client.New(s.url, "vr_x\r\n").GetRun(t.Context(), "r")
	errorContains(t, err, "Authorization header holds a control character")
	notContains(t, err.Error(), "vr_x")
	hasLen(t, s.hits(), 0)

	_, err = client.New("ftp://x", "t").GetRun(t.Context(), "r")
	errorContains(t, err, "base URL")
	for _, u := range []string{"ftp://x", "127.0.0.1:8080", "not a url", "http://", "http://h/?q=1", "http://h/#f"} {
		isError(t, client.CheckBaseURL(u), u)
	}
	for _, u := range []string{"http://127.0.0.1:8080", "https://api.example.com/", "http://proxy/valruns"} {
		noError(t, client.CheckBaseURL(u), u)
	}
}

// TestNotSentOnlyWhenNothingLeft: net/http resends a request that carries
// an Idempotency-Key when its reused connection breaks, on a new one. Here
// the server reads the start on a kept-alive connection, then goes away
// (hangs up, stops listening): the resend is refused, but the start went
// out and may have been processed, so the call must not say it was never
// sent.
func TestNotSentOnlyWhenNothingLeft(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noError(t, err)
	got := make(chan string, 2)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for i := range 2 {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			got <- req.Method + " " + req.URL.Path
			if i == 1 {
				_ = ln.Close() // the resend's dial is refused
				return
			}
			_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(runJSON), runJSON)
		}
	}()
	// One connection at most: the start waits for the GET's connection to
	// be idle again rather than dial a second one the server never reads
	// (a race that once left this test waiting for the start forever).
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxConnsPerHost: 1}}
	c := client.New("http://"+ln.Addr().String(), "t", client.WithMaxAttempts(1), client.WithHTTPClient(hc))
	_, err = c.GetRun(t.Context(), "r") // leaves a kept-alive connection
	noError(t, err)
	_, err = c.StartRun(t.Context(), "wf", 1)
	var re *client.RetryError
	errorAs(t, err, &re)
	received := func() string {
		select {
		case r := <-got:
			return r
		case <-time.After(time.Minute):
			t.Fatalf("the server did not read the start on the GET's connection: %v", err)
			return ""
		}
	}
	equal(t, "GET /api/runs/r/ then POST /api/workflows/wf/start/", received()+" then "+received())
	isFalse(t, re.NotSent, "the start reached the server: %v", err)
}
