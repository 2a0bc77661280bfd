package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRunLoadIsClosedLoop: never more requests in flight than clients,
// keep-alive connections (one per client), and every answer counted as
// success, non-2xx or unexpected.
func TestRunLoadIsClosedLoop(t *testing.T) {
	t.Parallel()
	var inFlight, maxInFlight, n atomic.Int64
	var mu sync.Mutex
	conns := map[string]bool{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := maxInFlight.Load()
			if cur <= m || maxInFlight.CompareAndSwap(m, cur) {
				break
			}
		}
		mu.Lock()
		conns[r.RemoteAddr] = true
		mu.Unlock()
		time.Sleep(time.Millisecond)
		switch i := n.Add(1); {
		case i%10 == 0:
			w.WriteHeader(http.StatusConflict)
		case i%10 == 5:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	srv.Start()
	defer srv.Close()

	next := func(c, i int) request {
		return request{Method: http.MethodPost, URL: srv.URL, Header: http.Header{"X-Client": {"c"}}, Body: []byte("{}")}
	}
	check := func(resp *http.Response) string {
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			return "replayed"
		}
		return ""
	}
	res := runLoad(context.Background(), 4, 50*time.Millisecond, 300*time.Millisecond, next, loadOptions{Check: check})
	require.LessOrEqual(t, maxInFlight.Load(), int64(4))
	require.LessOrEqual(t, len(conns), 4, "one keep-alive connection per client")
	require.Positive(t, res.Requests)
	require.Positive(t, res.Non2xx)
	require.Equal(t, res.Non2xx, res.Statuses[http.StatusConflict])
	require.Positive(t, res.Unexpected)
	require.Equal(t, "replayed", res.FirstError)
	require.Zero(t, res.Errors)
	require.True(t, slices.IsSorted(res.Latencies))
	require.GreaterOrEqual(t, res.Duration, 300*time.Millisecond)
	require.Positive(t, res.RPS())
}

// TestRunLoadHandsOverAnswers: Follow gets each 2xx answer with its body
// and the time its request was sent, those counted in the window marked;
// other answers are not handed over.
func TestRunLoadHandsOverAnswers(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		if i%4 == 0 {
			w.WriteHeader(http.StatusConflict)
		} else {
			w.WriteHeader(http.StatusCreated)
		}
		_, _ = w.Write([]byte("answer " + strconv.FormatInt(i, 10)))
	}))
	defer srv.Close()
	var mu sync.Mutex
	var seen []answer
	w := newWindowed(2)
	before := time.Now()
	res := runLoad(context.Background(), 2, 0, time.Minute, w.next(func(c, i int) request {
		return request{Method: http.MethodPost, URL: srv.URL, Header: http.Header{}}
	}), loadOptions{Stop: w.stop, OnWindow: w.onWindow, Follow: func(a answer) {
		if !a.InWindow {
			return
		}
		a.Body = slices.Clone(a.Body) // valid only during the call
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, a)
	}})
	require.Positive(t, res.Requests)
	require.Len(t, seen, res.Requests)
	for _, a := range seen {
		require.Equal(t, http.StatusCreated, a.Status)
		require.True(t, strings.HasPrefix(string(a.Body), "answer "), string(a.Body))
		require.False(t, a.Sent.Before(before.Round(0)))
		require.Equal(t, a.Sent, a.Sent.Round(0), "wall clock only")
	}
}

// TestRunLoadFollows: Follow sees each 2xx answer, the warm-up's too, with
// its client, before that client's next request, which may follow from it.
func TestRunLoadFollows(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.Header.Get("X-Req")))
	}))
	defer srv.Close()
	last := make([]string, 2) // by client, only from its goroutine
	var wrong, warm, in atomic.Int64
	w := newWindowed(2)
	res := runLoad(context.Background(), 2, 100*time.Millisecond, time.Minute, w.next(func(c, i int) request {
		if i > 0 && last[c] != fmt.Sprintf("%d-%d", c, i-1) {
			wrong.Add(1)
		}
		return request{Method: http.MethodGet, URL: srv.URL, Header: http.Header{"X-Req": {fmt.Sprintf("%d-%d", c, i)}}}
	}), loadOptions{Stop: w.stop, OnWindow: w.onWindow, Follow: func(a answer) {
		last[a.Client] = string(a.Body)
		if a.Answered.Before(a.Sent) {
			wrong.Add(1)
		}
		if a.InWindow {
			in.Add(1)
		} else {
			warm.Add(1)
		}
	}})
	require.Zero(t, wrong.Load(), "each next request followed its client's last answer")
	require.Positive(t, warm.Load(), "the warm-up's answers are followed")
	require.Equal(t, int64(res.Requests), in.Load())
}

// windowed ends a window once one of its requests has been counted, however
// long that takes: each client's next request starts only after its last
// one was counted, so a client asking for its next request after one that
// started inside the window closes stop. Tests that need a request in the
// window use it instead of guessing how long one takes.
type windowed struct {
	open    atomic.Bool
	started []atomic.Bool // client c started a request inside the window
	stop    chan struct{}
	once    sync.Once
}

func newWindowed(clients int) *windowed {
	return &windowed{started: make([]atomic.Bool, clients), stop: make(chan struct{})}
}

// next wraps a requestFunc.
func (w *windowed) next(f requestFunc) requestFunc {
	return func(c, i int) request {
		if w.started[c].Load() {
			w.once.Do(func() { close(w.stop) })
		}
		if w.open.Load() {
			w.started[c].Store(true)
		}
		return f(c, i)
	}
}

func (w *windowed) onWindow(open bool) {
	if open {
		w.open.Store(true)
	}
}

// TestRunLoadCountsTransportErrors: a server that is not there is errors, not requests.
func TestRunLoadCountsTransportErrors(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	w := newWindowed(2)
	next := w.next(func(c, i int) request {
		return request{Method: http.MethodGet, URL: "http://" + addr + "/", Header: http.Header{}}
	})
	res := runLoad(context.Background(), 2, 0, time.Minute, next, loadOptions{Stop: w.stop, OnWindow: w.onWindow})
	require.Positive(t, res.Errors)
	require.Zero(t, res.Requests)
	require.Contains(t, res.FirstError, "refused")
}

// TestRunLoadStopsEarly: a closed stop channel ends the window, long before
// its minute.
func TestRunLoadStopsEarly(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	w := newWindowed(2)
	next := w.next(func(c, i int) request { return request{Method: http.MethodGet, URL: srv.URL, Header: http.Header{}} })
	res := runLoad(context.Background(), 2, 0, time.Minute, next, loadOptions{Stop: w.stop, OnWindow: w.onWindow})
	require.Less(t, res.Duration, time.Minute)
	require.Positive(t, res.Requests)
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	var l []time.Duration
	for i := 1; i <= 1000; i++ {
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 500*time.Millisecond, percentile(l, 0.5))
	require.Equal(t, 990*time.Millisecond, percentile(l, 0.99))
	require.Equal(t, 999*time.Millisecond, percentile(l, 0.999))
	require.Equal(t, 1000*time.Millisecond, percentile(l, 1))
	require.Equal(t, time.Duration(0), percentile(nil, 0.5))
	require.Equal(t, 7*time.Millisecond, percentile([]time.Duration{7 * time.Millisecond}, 0.99))
}

func TestParseProc(t *testing.T) {
	t.Parallel()
	// comm with spaces and parentheses; utime 250, stime 50 ticks.
	stat := "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 1000 1000000 2000 18446744073709551615"
	d, err := parseStatCPU(stat)
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, d)
	_, err = parseStatCPU("garbage")
	require.Error(t, err)

	// This very process, read from /proc: its CPU time grows while it works.
	before, err := cpuTime(os.Getpid())
	require.NoError(t, err)
	x := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		for i := range 1_000_000 {
			x += i
		}
		if after, err := cpuTime(os.Getpid()); err == nil && after > before {
			break
		}
	}
	after, err := cpuTime(os.Getpid())
	require.NoError(t, err)
	require.Greater(t, after, before, "busy for a while (%d)", x)
}
