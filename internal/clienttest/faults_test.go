package clienttest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// fault is what faultTransport does to one request.
type fault int

const (
	faultNone fault = iota
	// faultResetBefore: the connection is reset before the request leaves;
	// the server never sees it.
	faultResetBefore
	// fault503: a 503 problem answered without forwarding (an overloaded
	// proxy); the server never sees it.
	fault503
	// faultDropAfter: the server processes the request and answers, and the
	// answer is lost (the connection resets): the run exists, the client
	// sees an error.
	faultDropAfter
	// faultCutBody: the server processes the request; the client gets the
	// status and headers, then the connection resets halfway through the body.
	faultCutBody
	// faultHangUp: the request is sent, and the client gives up at once
	// (a timeout) while the server is still processing it, so the retry may
	// find the key in flight (409).
	faultHangUp
	numFaults
)

var faultNames = [numFaults]string{"none", "reset before sending", "503 without forwarding",
	"answer dropped after processing", "body cut after processing", "hang-up while processing"}

// faultTransport wraps a real transport and injects network faults with a
// seeded RNG (the sequence of draws is fixed; which goroutine gets which
// draw depends on scheduling). It also records, per Idempotency-Key, the
// body hashes of every attempt, so a test can check that retries send the
// same key with the identical body.
type faultTransport struct {
	next http.RoundTripper
	// odds[f] is the probability of fault f (faultNone takes the rest).
	odds [numFaults]float64

	mu     sync.Mutex
	rng    *rand.Rand
	bodies map[string]map[[32]byte]bool // key -> body hashes seen
	tries  map[string]int               // key -> attempts seen
	fired  [numFaults]atomic.Int64
	// conflicts counts the 409s the server answered (keys found in flight).
	conflicts atomic.Int64
	pending   sync.WaitGroup // hang-up requests still running
}

func newFaultTransport(next http.RoundTripper, seed uint64, odds [numFaults]float64) *faultTransport {
	return &faultTransport{next: next, odds: odds, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		bodies: map[string]map[[32]byte]bool{}, tries: map[string]int{}}
}

// errReset looks like what a reset connection gives a Go client.
func errReset(op string) error {
	return &net.OpError{Op: op, Net: "tcp", Err: os.NewSyscallError(op, syscall.ECONNRESET)}
}

func (ft *faultTransport) draw(req *http.Request) (fault, []byte, error) {
	var body []byte
	if req.Body != nil {
		var err error
		body, err = io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return faultNone, nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	ft.mu.Lock()
	defer ft.mu.Unlock()
	if k := req.Header.Get("Idempotency-Key"); k != "" {
		if ft.bodies[k] == nil {
			ft.bodies[k] = map[[32]byte]bool{}
		}
		ft.bodies[k][sha256.Sum256(body)] = true
		ft.tries[k]++
	}
	x := ft.rng.Float64()
	for f := faultNone + 1; f < numFaults; f++ {
		if x < ft.odds[f] {
			return f, body, nil
		}
		x -= ft.odds[f]
	}
	return faultNone, body, nil
}

func (ft *faultTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	f, body, err := ft.draw(req)
	if err != nil {
		return nil, err
	}
	ft.fired[f].Add(1)
	switch f {
	case faultResetBefore:
		return nil, errReset("write")
	case fault503:
		return &http.Response{
			StatusCode: http.StatusServiceUnavailable, Status: "503 Service Unavailable", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"application/problem+json"}},
			Body: io.NopCloser(strings.NewReader(`{"type":"/problems/service_unavailable","title":"Service Unavailable",` +
				`"status":503,"detail":"injected by the test","code":"service_unavailable"}`)),
			Request: req,
		}, nil
	case faultDropAfter:
		resp, err := ft.next.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil, errReset("read")
	case faultCutBody:
		resp, err := ft.next.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b[:len(b)/2]), errReader{errReset("read")}))
		resp.ContentLength = -1
		return resp, nil
	case faultHangUp:
		// The request goes on without the caller, as a request the client
		// stopped waiting for does on the server.
		bg := req.Clone(context.WithoutCancel(req.Context()))
		bg.Body = io.NopCloser(bytes.NewReader(body))
		ft.pending.Add(1)
		go func() {
			defer ft.pending.Done()
			if resp, err := ft.next.RoundTrip(bg); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}()
		return nil, errReset("read")
	}
	resp, err := ft.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusConflict {
		ft.conflicts.Add(1)
	}
	return resp, err
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
