package reliability

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// overloadRetrying is overload_memory as single-node users meet it: one
// `valruns serve --worker` (the worker in the API's process) with the
// default bounds and GOGC and GOMEMLIMIT unset. First 16 starts of 300 KB
// (heavy but ordinary traffic) at once, each sent once: all must be
// admitted (201), since the default body budget holds them all. Then 300
// clients each send a 1 MiB array of numbers (the costliest shape per
// byte) and retry every 503 and 429 after its Retry-After plus up to
// 250 ms of jitter, as the Go client does, until it is accepted. Every one
// must get its 201 (a client starved by the others is a failure), every
// answer on the way is a 201 or a 503/429 with Retry-After, never a reset;
// the process's peak RSS (VmHWM) stays under 300 MB, asserted as memory,
// not timing; and every run ends final.
func overloadRetrying(t *testing.T, s *suite, res *result) {
	c := newClusterWith(t, s, 0, 0, func(*cluster) []string {
		return []string{"GOGC=", "GOMEMLIMIT="} // the runtime's defaults, not the test runner's
	})
	api := c.startProc("api-A", "serve --worker", "HTTP_ADDR")
	if api == nil {
		t.FailNow()
	}
	c.servers = []*vproc{api}
	o := c.newOrg("retrying")
	hc := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 300}}
	t.Cleanup(hc.CloseIdleConnections)
	start := startURL(t, hc, api.url, o, "retrying")

	// 16 ordinary heavy starts at once: 300 KB arrays of numbers.
	heavy := []byte(`{"submission":[` + strings.Repeat("12345,", 49_999) + `12345]}`)
	answers := make([]*answer, 16)
	errs := make([]error, 16)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i], errs[i] = postJSON(hc, start, o.Token, "heavy-"+strconv.Itoa(i), heavy) })
	}
	wg.Wait()
	res.Ops += len(answers)
	res.Requests += int64(len(answers))
	for i, a := range answers {
		switch {
		case errs[i] != nil:
			res.Losses++
			res.fail(t, "300 KB start %d got no answer: %v", i, errs[i])
		case a.Status != http.StatusCreated:
			res.fail(t, "300 KB start %d of 16 at once answered %d %s: the default budget should admit them all", i, a.Status, a.code())
		}
	}

	idle := procStatusBytes(t, api.pid(), "VmRSS")
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", api.pid()), []byte("5"), 0); err != nil {
		t.Logf("could not reset the peak RSS: %v", err)
	}
	const clients = 300
	body := []byte(`{"submission":[`) // 1 MiB: about 524,000 numbers
	for len(body) < 1<<20-6 {
		body = append(body, "1,"...)
	}
	body = append(body, "1]}"...)
	var attempts, refused, lost atomic.Int64
	var mu sync.Mutex
	var failures []string // res.fail is not safe from many goroutines
	failed := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(format, args...))
	}
	accepted := make([]bool, clients)
	deadline := time.Now().Add(10 * time.Minute) // a generous bound on waiting, not a timing checked
	for i := range clients {
		wg.Go(func() {
			key := "retry-" + strconv.Itoa(i)
			for time.Now().Before(deadline) {
				attempts.Add(1)
				a, err := postJSON(hc, start, o.Token, key, body)
				wait := 250 * time.Millisecond
				switch {
				case err != nil:
					lost.Add(1)
					failed("start %s got no answer: %v", key, err)
				case a.Status == http.StatusCreated:
					accepted[i] = true
					return
				case (a.Status == http.StatusServiceUnavailable || a.Status == http.StatusTooManyRequests) && a.Header.Get("Retry-After") != "":
					refused.Add(1)
					ra, perr := strconv.Atoi(a.Header.Get("Retry-After"))
					if perr != nil || ra < 0 {
						failed("start %s: Retry-After %q is not delay-seconds", key, a.Header.Get("Retry-After"))
						return
					}
					wait = time.Duration(min(ra, 30)) * time.Second
				default:
					failed("start %s answered %d %s (Retry-After %q): want 201, or 503/429 with Retry-After",
						key, a.Status, a.code(), a.Header.Get("Retry-After"))
					return
				}
				time.Sleep(wait + rand.N(250*time.Millisecond))
			}
		})
	}
	wg.Wait()
	peak := procStatusBytes(t, api.pid(), "VmHWM")
	for _, f := range failures {
		res.fail(t, "%s", f)
	}
	res.Ops += clients
	res.Requests += attempts.Load()
	res.Losses += int(lost.Load())
	res.Expected5xx += int(refused.Load())
	starved := 0
	for _, ok := range accepted {
		if !ok {
			starved++
		}
	}
	res.figure("300 clients retrying 1 MiB arrays until accepted, on serve --worker: %d attempts, %d refused with Retry-After, %d never accepted; RSS %d MB at rest, %d MB at the peak (asserted: under %d MB)",
		attempts.Load(), refused.Load(), starved, idle/1_000_000, peak/1_000_000, overloadPeakLimit/1_000_000)
	if starved > 0 {
		res.fail(t, "%d of %d retrying clients never got their 201 within 10 minutes", starved, clients)
	}
	if peak >= overloadPeakLimit {
		res.fail(t, "serve --worker peaked at %d MB RSS, over %d MB, with the default bounds", peak/1_000_000, overloadPeakLimit/1_000_000)
	}
	runs, err := c.count(`SELECT count(*) FROM validation_runs WHERE idempotency_key LIKE 'retry-%'`)
	if err != nil {
		t.Fatal(err)
	}
	if runs != int64(clients-starved) {
		res.fail(t, "%d clients were accepted but %d runs exist", clients-starved, runs)
	}
	c.waitAllFinal(t, res)
}
