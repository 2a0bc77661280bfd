package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// overloadPeakLimit is what one API process may hold at its peak, in bytes
// (300 MB), with the default bounds, however many large starts arrive at once.
const overloadPeakLimit = 300_000_000

// overloadMemory sends 300 starts of 1 MB bodies at once to one `valruns
// serve` running with the default overload bounds (MAX_BODY_BYTES_IN_FLIGHT,
// MAX_REQUESTS_IN_FLIGHT, OVERLOAD_WAIT, and the soft memory limit serve
// derives from them; GOGC and GOMEMLIMIT unset), twice: submissions that
// are one 1 MB string, then arrays of 500,000 small numbers, the costliest
// shape per byte (each value is a node of the canonical parse tree). Each
// start is sent once, without retries. Every answer must be a 201 whose run
// exists and ends final, or a 503 overloaded with Retry-After that stored
// nothing; never another status, never a reset. (A 503 with Retry-After of
// another code, the database too slow to answer on a starved machine, is
// counted apart and allowed: it too stored nothing, and the client has its
// answer.) The process's peak RSS
// (VmHWM of /proc/PID/status, reset before each wave) must stay under
// 300 MB: memory is not timing, so this is asserted.
func overloadMemory(t *testing.T, s *suite, res *result) {
	c := newClusterWith(t, s, 1, 1, func(*cluster) []string {
		return []string{"GOGC=", "GOMEMLIMIT="} // the runtime's defaults, not the test runner's
	})
	o := c.newOrg("overload")
	api := c.servers[0]
	hc := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 300}}
	t.Cleanup(hc.CloseIdleConnections)

	start := startURL(t, hc, api.url, o, "overload")

	const parallel = 300
	var keys []string
	for _, wave := range []struct{ name, body string }{
		{"1 MB strings", `{"submission":"` + strings.Repeat("x", 1_000_000) + `"}`},
		{"1 MB arrays of 500,000 numbers", `{"submission":[` + strings.Repeat("1,", 499_999) + `1]}`},
	} {
		idle := procStatusBytes(t, api.pid(), "VmRSS")
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", api.pid()), []byte("5"), 0); err != nil {
			// Without the reset the peak is the process's so far: the
			// check still holds, only the figure covers both waves.
			t.Logf("could not reset the peak RSS before the wave of %s: %v", wave.name, err)
		}
		prefix := fmt.Sprintf("mem-%d-", len(keys))
		answers := make([]*answer, parallel)
		errs := make([]error, parallel)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i := range parallel {
			keys = append(keys, prefix+strconv.Itoa(i))
			wg.Go(func() {
				<-gate
				answers[i], errs[i] = postJSON(hc, start, o.Token, prefix+strconv.Itoa(i), []byte(wave.body))
			})
		}
		close(gate)
		wg.Wait()
		peak := procStatusBytes(t, api.pid(), "VmHWM")
		res.Ops += parallel
		res.Requests += parallel

		created, refused, unavailable := 0, 0, 0
		var refusedKeys []string
		for i, a := range answers {
			key := prefix + strconv.Itoa(i)
			switch {
			case errs[i] != nil:
				res.Losses++
				res.fail(t, "%s: start %s got no answer: %v", wave.name, key, errs[i])
			case a.Status == http.StatusCreated:
				created++
			case a.Status == http.StatusServiceUnavailable && a.code() == "overloaded" && a.Header.Get("Retry-After") != "":
				refused++
				res.Expected5xx++
				refusedKeys = append(refusedKeys, key)
			case a.Status == http.StatusServiceUnavailable && a.Header.Get("Retry-After") != "":
				unavailable++
				res.Expected5xx++
				refusedKeys = append(refusedKeys, key)
			default:
				if a.Status >= 500 {
					res.Unexpected5xx++
				}
				res.fail(t, "%s: start %s answered %d %s (Retry-After %q): want 201, or 503 overloaded with Retry-After",
					wave.name, key, a.Status, a.code(), a.Header.Get("Retry-After"))
			}
		}
		runs, err := c.count(`SELECT count(*) FROM validation_runs WHERE idempotency_key LIKE $1`, prefix+"%")
		if err != nil {
			t.Fatal(err)
		}
		if runs != int64(created) {
			res.fail(t, "%s: %d starts answered 201 but %d runs exist", wave.name, created, runs)
		}
		if stored := storedKeys(c, refusedKeys); len(stored) > 0 {
			res.fail(t, "%s: %d starts answered 503 stored their key, such as %s", wave.name, len(stored), stored[0])
		}
		if created == 0 {
			res.fail(t, "%s: no start was admitted", wave.name)
		}
		res.figure("%s, %d at once: %d answered 201, %d answered 503 overloaded, %d another 503 with Retry-After; the API process's RSS %d MB at rest, %d MB at the peak (asserted: under %d MB)",
			wave.name, parallel, created, refused, unavailable, idle/1_000_000, peak/1_000_000, overloadPeakLimit/1_000_000)
		if peak >= overloadPeakLimit {
			res.fail(t, "%s: the API process peaked at %d MB RSS, over %d MB, with the default bounds", wave.name, peak/1_000_000, overloadPeakLimit/1_000_000)
		}
	}

	// Every admitted start's run ends final, like any other.
	c.waitAllFinal(t, res)
	errored, _ := c.count(`SELECT count(*) FROM validation_runs WHERE status = 'error'`)
	res.Errored = int(errored)
	if errored > 0 {
		res.fail(t, "%d admitted runs ended error", errored)
	}
}

// postJSON sends one POST with a JSON body (an Idempotency-Key when key is
// not empty) and reads the whole answer.
func postJSON(hc *http.Client, url, token, key string, body []byte) (*answer, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	return &answer{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// procStatusBytes reads a field of /proc/PID/status given in kB (KiB), such
// as VmRSS or VmHWM (the peak resident set size), in bytes.
func procStatusBytes(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the status of process %d: %v", pid, err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s of process %d: %q", field, pid, line)
			}
			return n << 10
		}
	}
	t.Fatalf("no %s in the status of process %d", field, pid)
	return 0
}

// startURL creates a workflow without rules for o, named name, and returns
// its start's URL.
func startURL(t *testing.T, hc *http.Client, base string, o org, name string) string {
	t.Helper()
	a, err := postJSON(hc, base+"/api/workflows/", o.Token, "", []byte(`{"name":"`+name+`"}`))
	if err != nil || a.Status != http.StatusCreated {
		t.Fatalf("create workflow: %v %+v", err, a)
	}
	var wf struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(a.Body, &wf); err != nil || wf.ID == "" {
		t.Fatalf("create workflow: %s", clip(a.Body))
	}
	return base + "/api/workflows/" + wf.ID + "/start/"
}

// waitAllFinal waits up to 3 minutes for every run to be final, counting
// those that are not as stranded, then records how many runs exist.
func (c *cluster) waitAllFinal(t *testing.T, res *result) {
	t.Helper()
	final := func() (int64, error) {
		return c.count(`SELECT count(*) FROM validation_runs WHERE status IN ('queued', 'running')`)
	}
	if !waitUntil(3*time.Minute, func() bool { n, err := final(); return err == nil && n == 0 }) {
		n, _ := final()
		res.Stranded = int(n)
		res.fail(t, "%d admitted runs are not final after 3 minutes", n)
	}
	res.Runs, _ = c.count(`SELECT count(*) FROM validation_runs`)
}
