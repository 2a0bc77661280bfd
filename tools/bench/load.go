package main

// The closed-loop load generator: N clients on keep-alive connections, each
// sending its next request when the previous answer has arrived, as
// retrying API clients do. Answers are read to the end; latencies of the
// requests that complete inside the measured window are kept whole and
// sorted for the percentiles.

import (
	"bytes"
	"context"
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
	Method string
	URL    string
	Header http.Header
	Body   []byte
}

// requestFunc makes client c's i-th request (i counts from 0, warm-up included).
type requestFunc func(c, i int) request

// checkFunc judges a 2xx answer: "" is fine, anything else is counted as
// unexpected (such as a start that was not a replay when it should be).
type checkFunc func(resp *http.Response) string

// loadResult is one measured window.
type loadResult struct {
	Clients    int
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
func (r loadResult) RPS() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Duration.Seconds()
}

// Percentile is the q-quantile (0 < q <= 1) latency, nearest rank.
func (r loadResult) Percentile(q float64) time.Duration { return percentile(r.Latencies, q) }

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(q*float64(len(sorted))+0.999999999) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return sorted[rank]
}

// newHTTPClient is a keep-alive client with one connection per load client.
func newHTTPClient(clients int) *http.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        clients * 2,
		MaxIdleConnsPerHost: clients * 2,
		MaxConnsPerHost:     clients,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// answer is a 2xx answer counted in the measured window, as an observer
// sees it.
type answer struct {
	Status int
	Sent   time.Time // when the request was sent, wall clock only
	Body   []byte    // valid only during the observer's call
}

// loadOptions are runLoad's optional parts; the zero value has none.
type loadOptions struct {
	Check checkFunc
	// Stop ends the window early when it is closed first.
	Stop <-chan struct{}
	// OnWindow is called when the measured window opens and when it closes.
	OnWindow func(open bool)
	// Observe is handed each 2xx answer counted in the window, from the
	// clients' goroutines at once. Only with it are bodies read into
	// memory; without it they are discarded.
	Observe func(answer)
}

// runLoad warms up for warm, then measures for dur (or until stop is
// closed, when stop is not nil and closes first). onWindow, when set, is
// called when the measured window opens and when it closes.
func runLoad(ctx context.Context, clients int, warm, dur time.Duration, next requestFunc, check checkFunc, stop <-chan struct{}, onWindow func(open bool)) loadResult {
	return runLoadWith(ctx, clients, warm, dur, next, loadOptions{Check: check, Stop: stop, OnWindow: onWindow})
}

// runLoadWith is runLoad with its options in a struct, and an observer.
func runLoadWith(ctx context.Context, clients int, warm, dur time.Duration, next requestFunc, o loadOptions) loadResult {
	hc := newHTTPClient(clients)
	defer hc.CloseIdleConnections()

	var (
		measuring atomic.Bool
		done      atomic.Bool
		mu        sync.Mutex
		res       = loadResult{Clients: clients, Statuses: map[int]int{}}
		wg        sync.WaitGroup
	)
	perClient := make([][]time.Duration, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 4096)
			var body bytes.Buffer
			for i := 0; !done.Load(); i++ {
				rq := next(c, i)
				hr, err := http.NewRequestWithContext(ctx, rq.Method, rq.URL, bytes.NewReader(rq.Body))
				if err != nil {
					panic(err)
				}
				hr.Header = rq.Header
				t0 := time.Now()
				resp, err := hc.Do(hr)
				var status int
				var verdict string
				if err == nil {
					if o.Observe != nil {
						body.Reset()
						_, err = body.ReadFrom(resp.Body)
					} else {
						_, err = io.Copy(io.Discard, resp.Body)
					}
					_ = resp.Body.Close()
					status = resp.StatusCode
					if status/100 == 2 && o.Check != nil {
						verdict = o.Check(resp)
					}
				}
				d := time.Since(t0)
				if !measuring.Load() || done.Load() {
					if err != nil && ctx.Err() != nil {
						break
					}
					continue
				}
				if err != nil || status/100 != 2 || verdict != "" {
					mu.Lock()
					switch {
					case err != nil:
						res.Errors++
						if res.FirstError == "" {
							res.FirstError = err.Error()
						}
					case status/100 != 2:
						res.Non2xx++
						res.Statuses[status]++
					default:
						res.Unexpected++
						if res.FirstError == "" {
							res.FirstError = verdict
						}
					}
					mu.Unlock()
					if err != nil {
						time.Sleep(10 * time.Millisecond) // do not spin on a dead server
					}
					continue
				}
				lat = append(lat, d)
				if o.Observe != nil {
					o.Observe(answer{Status: status, Sent: t0.Round(0), Body: body.Bytes()})
				}
			}
			perClient[c] = lat
		}()
	}

	wait := func(d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-o.Stop:
		case <-ctx.Done():
		}
	}
	wait(warm)
	measuring.Store(true)
	if o.OnWindow != nil {
		o.OnWindow(true)
	}
	start := time.Now()
	wait(dur)
	done.Store(true)
	res.Duration = time.Since(start)
	if o.OnWindow != nil {
		o.OnWindow(false)
	}
	wg.Wait()
	for _, l := range perClient {
		res.Latencies = append(res.Latencies, l...)
	}
	slices.Sort(res.Latencies)
	res.Requests = len(res.Latencies)
	return res
}
