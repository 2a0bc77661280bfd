package main

// The closed-loop load generator: N clients on keep-alive connections, each
// sending its next request when the previous answer has arrived; the
// window's latencies are kept whole.

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// request is one request a client sends.
type request struct {
	Method, URL string
	Header      http.Header
	Body        []byte
}

// requestFunc makes client c's i-th request (i counts from 0, warm-up included).
type requestFunc func(c, i int) request

// checkFunc judges a 2xx answer: "" is fine, anything else is counted as
// unexpected (such as a start that was not a replay when it should be).
type checkFunc func(resp *http.Response) string

// loadResult is one measured window.
type loadResult struct {
	Duration   time.Duration
	Requests   int // completed inside the window
	Errors     int // transport errors (connection refused, reset, timeout)
	Non2xx     int
	Unexpected int
	Statuses   map[int]int // non-2xx answers by status
	FirstError string
	Latencies  []time.Duration // sorted
}

// RPS is completed requests per second.
func (r loadResult) RPS() float64 { return perSec(r.Requests, r.Duration) }

// Percentile is the q-quantile (0 < q <= 1) latency, nearest rank.
func (r loadResult) Percentile(q float64) time.Duration { return percentile(r.Latencies, q) }

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[max(0, min(int(q*float64(len(sorted))+0.999999999)-1, len(sorted)-1))]
}

// answer is a 2xx answer as Follow sees it.
type answer struct {
	Status   int
	Client   int       // the load client that sent it
	Sent     time.Time // when the request was sent, wall clock only
	Answered time.Time // when its answer had been read, wall clock only
	Body     []byte    // valid only during the Follow call
	InWindow bool      // the window counts it
}

// loadOptions are runLoad's optional parts; the zero value has none.
type loadOptions struct {
	Check    checkFunc
	Stop     <-chan struct{} // ends the window early when it is closed first
	Open     <-chan struct{} // when set, holds the window shut after the warm-up until closed
	OnWindow func(open bool) // called when the measured window opens and when it closes
	// Follow is handed each 2xx answer (the warm-up's and after the window's
	// too) in its client's goroutine, before that client's next request, which
	// may follow from it (only then are bodies kept).
	Follow func(answer)
}

// runLoad runs clients for warm, then measures for dur (or until o.Stop closes).
func runLoad(ctx context.Context, clients int, warm, dur time.Duration, next requestFunc, o loadOptions) loadResult {
	// A keep-alive client with one connection per load client.
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:  (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns: clients * 2, MaxIdleConnsPerHost: clients * 2, MaxConnsPerHost: clients,
		IdleConnTimeout: time.Minute, DisableCompression: true,
	}}
	l := &loader{ctx: ctx, hc: hc, next: next, o: o, res: loadResult{Statuses: map[int]int{}}, lat: make([][]time.Duration, clients)}
	defer l.hc.CloseIdleConnections()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() { l.client(c) })
	}
	wait := func(d time.Duration, open <-chan struct{}) {
		select {
		case <-time.After(d):
		case <-open:
		case <-o.Stop:
		case <-ctx.Done():
		}
	}
	if o.OnWindow == nil {
		o.OnWindow = func(bool) {}
	}
	if wait(warm, nil); o.Open != nil {
		wait(24*time.Hour, o.Open)
	}
	l.measuring.Store(true)
	o.OnWindow(true)
	start := time.Now()
	wait(dur, nil)
	l.done.Store(true)
	l.res.Duration = time.Since(start)
	o.OnWindow(false)
	wg.Wait()
	l.res.Latencies = slices.Concat(l.lat...)
	slices.Sort(l.res.Latencies)
	l.res.Requests = len(l.res.Latencies)
	return l.res
}

// loader is runLoad's state, shared by its clients.
type loader struct {
	ctx             context.Context
	hc              *http.Client
	next            requestFunc
	o               loadOptions
	measuring, done atomic.Bool
	mu              sync.Mutex
	res             loadResult
	lat             [][]time.Duration // by client
}

// client is client c's loop: a request, its answer read to the end, its
// latency kept when it was inside the window, the next request.
func (l *loader) client(c int) {
	var body bytes.Buffer
	for i := 0; !l.done.Load(); i++ {
		rq := l.next(c, i)
		hr, err := http.NewRequestWithContext(l.ctx, rq.Method, rq.URL, bytes.NewReader(rq.Body))
		if err != nil {
			panic(err)
		}
		hr.Header = rq.Header
		t0 := time.Now()
		resp, err := l.hc.Do(hr)
		status, verdict := 0, ""
		if err == nil {
			body.Reset()
			if l.o.Follow != nil {
				_, err = body.ReadFrom(resp.Body)
			} else {
				_, err = io.Copy(io.Discard, resp.Body)
			}
			_ = resp.Body.Close()
			if status = resp.StatusCode; status/100 == 2 && l.o.Check != nil {
				verdict = l.o.Check(resp)
			}
		}
		d := time.Since(t0)
		in := l.measuring.Load() && !l.done.Load()
		a := answer{Status: status, Client: c, Sent: t0.Round(0), Answered: t0.Add(d).Round(0), Body: body.Bytes(), InWindow: in}
		if err == nil && status/100 == 2 && verdict == "" && l.o.Follow != nil {
			l.o.Follow(a)
		}
		switch {
		case !in:
			if err != nil && l.ctx.Err() != nil {
				return
			}
		case err == nil && status/100 == 2 && verdict == "":
			l.lat[c] = append(l.lat[c], d)
		default:
			l.failed(status, verdict, err)
		}
	}
}

// failed counts an answer that was not as expected.
func (l *loader) failed(status int, verdict string, err error) {
	l.mu.Lock()
	switch {
	case err != nil:
		l.res.Errors++
		l.res.FirstError = cmp.Or(l.res.FirstError, err.Error())
	case status/100 != 2:
		l.res.Non2xx++
		l.res.Statuses[status]++
	default:
		l.res.Unexpected++
		l.res.FirstError = cmp.Or(l.res.FirstError, verdict)
	}
	l.mu.Unlock()
	if err != nil {
		time.Sleep(10 * time.Millisecond) // do not spin on a dead server
	}
}

// headerFor is the header of a request with token and key ("" for none).
func headerFor(token, key string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return h
}

// newKeys is a requestFunc of new-key starts of o's workflow as token ("": none).
func newKeys(base string, o benchOrg, token string) requestFunc {
	url, body, run := base+o.startPath(), []byte(startBody), time.Now().UnixNano()
	return func(c, i int) request {
		return request{http.MethodPost, url, headerFor(token, fmt.Sprintf("%d-%d-%d", run, c, i)), body}
	}
}

// replayCheck judges a 2xx of valruns: a finished key must be answered as
// a replay (replayed), a new key must not.
func replayCheck(replayed bool) checkFunc {
	return func(resp *http.Response) string {
		switch got := resp.Header.Get("Idempotent-Replayed") == "true"; {
		case got && !replayed:
			return "a new key was answered as a replay"
		case !got && replayed:
			return "a finished key was executed again (no Idempotent-Replayed: true)"
		}
		return ""
	}
}

// post sends body until it is answered 201, and returns that answer; a 503
// (the box too busy), a 409 (its own retry in flight) or a 429 (the start
// rate, which stores nothing) is retried with the same key, as a client would.
func post(ctx context.Context, url string, body []byte, h http.Header) ([]byte, error) {
	for try := 1; ; try++ {
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		r.Header = h.Clone()
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(r)
		if err != nil {
			return nil, err
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusCreated:
			return b, nil
		case http.StatusServiceUnavailable, http.StatusConflict, http.StatusTooManyRequests:
			if try < 20 {
				sleep(ctx, 300*time.Millisecond)
				continue
			}
		}
		return nil, fmt.Errorf("POST %s: %d %s", url, resp.StatusCode, short(string(b), 200))
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}
