package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// fairExecution says whether the binary under test has issue 16's fair
// execution: a run waits behind a bounded share of another organisation's
// runs (ORG_RUN_SHARE, which the suite sets to one run per worker slot), not behind
// all of them. It was false until fair execution (the gate, tasks/fair.go)
// was merged. While false, noisy_neighbour still counts how many of A's
// runs went ahead of each of B's, and its line under the table says the
// bound is NOT ENFORCED and by how much it is missed; it does not fail on
// it. While true, a miss fails the scenario. Without the gate (first in,
// first out across organisations) the count is most of A's backlog, far
// over the bound: 78 of 100, bound 8.
const fairExecution = true

// noisyPause is the gap between two of B's starts: B starts a run now and
// then, one at a time.
const noisyPause = 100 * time.Millisecond

// noisyNeighbour: organisation B starts runs alone; then organisation A
// queues slow runs and floods cheap starts from 16 clients while B starts
// runs again; then, with the workers stopped (idle), A queues a backlog and
// B starts a few runs behind it, and the workers go on. Every run of A and
// B is final exactly once; B is never rate limited; and (with
// fairExecution) each of B's runs behind the backlog executes after at
// most twice the worker slots of A's runs that were queued ahead of it: an
// ordering count from the runs' own timestamps, never a timing. B's start
// latency and start-to-final are reported, alone and during the flood.
func noisyNeighbour(t *testing.T, s *suite, res *result) {
	c, cl, rec, orgA := setup(t, s, "noisy-a")
	orgB := c.newOrg("noisy-b")
	ctx := context.Background()
	slow, cheap := slowWorkflow(), orderWorkflow()
	slowID := createWorkflow(t, cl, orgA, slow)
	floodID := createWorkflow(t, cl, orgA, cheap)
	bID := createWorkflow(t, cl, orgB, cheap)

	bAlone := makeOps("noisy-b-alone", 20, orgB, bID, cheap)
	aloneLat := startPaced(ctx, cl, bAlone)

	slowOps := makeOps("noisy-a-slow", 40, orgA, slowID, slow)
	startLoad(ctx, cl, slowOps, 8).wait()
	flood := makeOps("noisy-a-flood", 1500, orgA, floodID, cheap)
	lf := startLoad(ctx, cl, flood, 16)
	if !waitUntil(time.Minute, func() bool { return lf.done.Load() >= 50 }) {
		t.Fatalf("A's flood did not get going: %d starts done", lf.done.Load())
	}
	bFlood := makeOps("noisy-b-flood", 20, orgB, bID, cheap)
	floodLat := startPaced(ctx, cl, bFlood)
	duringFlood := lf.done.Load() < int64(len(flood))
	lf.wait()

	// A's backlog, queued before B's runs whatever the machine's speed:
	// the workers are stopped (idle: nothing of theirs runs out of its
	// lease) while A starts its runs and B then starts fewer runs than its
	// own share (all of them go to the queue at once).
	if !waitUntil(finalWithin, func() bool {
		n, err := c.count(`SELECT count(*) FROM validation_runs WHERE status IN ('queued', 'running')`)
		return err == nil && n == 0
	}) {
		res.fail(t, "the runs of A's flood were not all final within %s", finalWithin)
	}
	for _, w := range c.workers {
		w.signal(syscall.SIGSTOP)
		if !waitUntil(10*time.Second, w.isStopped) {
			t.Fatalf("%s did not stop", w.name)
		}
	}
	stoppedAt := time.Now()
	queued := makeOps("noisy-a-queued", 100, orgA, floodID, cheap)
	startLoad(ctx, cl, queued, 16).wait()
	bQueued := makeOps("noisy-b-queued", 4, orgB, bID, cheap)
	startPaced(ctx, cl, bQueued)
	// The API hands runs to Redis after their 201, in the background: the
	// workers go on only once every run of the backlog and of B is there
	// (in the ready list, or waiting at the gate). Before, a loaded machine handed B's runs off
	// after the workers had gone on with A's, and B's were then queued
	// behind more of A's than the share. Best effort: the count is only
	// the precondition of a fair order, not the thing checked.
	rc := s.redis.client()
	waitUntil(time.Minute, func() bool {
		ready, _ := rc.LLen(ctx, "valruns:{default}:ready").Result()
		waiting, _ := rc.HLen(ctx, "valruns:{fair}:payloads").Result()
		return int(ready+waiting) >= len(queued)+len(bQueued)
	})
	// The order the workers will take the runs in: the ready list, read
	// while nothing takes from it. A's runs beyond its share wait at the
	// gate, behind B's.
	queueAhead, queueWorst, qerr := queuedAhead(ctx, rc, orgA.ID, bQueued)
	_ = rc.Close()
	for _, w := range c.workers {
		w.signal(syscall.SIGCONT)
	}
	stopped := time.Since(stoppedAt)

	ops := slices.Concat(bAlone, slowOps, flood, bFlood, queued, bQueued)
	verify(t, c, res, ops, expectations{})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)

	// B is never rate limited, whatever A does; A may be (a 429 with
	// Retry-After, retried by the client, nothing stored).
	aLimited := 0
	for _, o := range ops {
		for _, a := range o.Out.Attempts {
			switch {
			case a.Status == 429 && o.Org.ID == orgB.ID:
				res.fail(t, "B's start %s was answered 429 %s", o.Key, a.Code)
			case a.Status == 429:
				aLimited++
			}
		}
	}

	slots := len(c.workers) * s.cfg.WorkerConcurrency
	bound := 2 * slots
	ahead, ranFirst, _ := fairnessCounts(t, c, orgA, bQueued)
	if ahead <= bound {
		res.fail(t, "at most %d of A's runs were queued ahead of any of B's runs (bound %d): the scenario proved nothing", ahead, bound)
	}
	// Asserted: the order the workers take runs in (the ready list is first
	// in, first out). Reported: the order the runs started, which a loaded
	// machine may shuffle further: a slot whose claim of B's run waits for
	// the database while the other slots go through several of A's cheap runs
	// is slow, not unfair.
	verdict := "within"
	switch {
	case qerr != nil:
		res.fail(t, "read the queue's order: %v", qerr)
	case queueAhead > bound:
		verdict = "OVER"
		if fairExecution {
			res.fail(t, "B's run %s was queued behind %d of A's runs that were started before it; at most %d (twice the %d worker slots) may go first", queueWorst, queueAhead, bound, slots)
		} else {
			t.Logf("fairness bound NOT ENFORCED (fairExecution = false): B's run %s queued behind %d of A's runs, bound %d", queueWorst, queueAhead, bound)
		}
	}
	enforced := "asserted"
	if !fairExecution {
		enforced = "NOT ENFORCED (fairExecution = false)"
	}
	res.figure("fairness, %s: %d of A's runs queued (workers stopped for %.1f s), then %d of B's: each of B's was queued behind at most %d of A's runs (%s the bound %d = 2 × %d worker slots), and started behind at most %d of them (reported)",
		enforced, len(queued), stopped.Seconds(), len(bQueued), queueAhead, verdict, bound, slots, ranFirst)
	_, floodFirst, _ := fairnessCounts(t, c, orgA, bFlood)
	aloneFinal := startToFinal(t, c, bAlone)
	floodFinal := startToFinal(t, c, bFlood)
	res.figure("B alone, %d starts one at a time: start p50 %s / p99 %s, start-to-final p50 %s / p99 %s",
		len(bAlone), msText(pct(aloneLat, .5)), msText(pct(aloneLat, .99)), msText(pct(aloneFinal, .5)), msText(pct(aloneFinal, .99)))
	floodNote := "while A's flood went on"
	if !duringFlood {
		floodNote = "A's flood ended before B's last start"
	}
	res.figure("B while A floods (%d cheap starts from 16 clients, after %d slow ones; %d answers 429 to A), %d starts, %s: start p50 %s / p99 %s, start-to-final p50 %s / p99 %s; at most %d of A's runs started ahead of one of B's (not asserted: with the workers running, A's runs that started while B's start request was still being answered and handed to the queue count too)",
		len(flood), len(slowOps), aLimited, len(bFlood), floodNote, msText(pct(floodLat, .5)), msText(pct(floodLat, .99)), msText(pct(floodFinal, .5)), msText(pct(floodFinal, .99)), floodFirst)
}

// queuedAhead reads the ready list in the order the workers will take it
// (pushed on the right, taken from the left) and returns, of B's runs
// (bOps), the most of organisation a's runs ahead of one, and that run.
func queuedAhead(ctx context.Context, rc *redis.Client, a string, bOps []*op) (int, string, error) {
	items, err := rc.LRange(ctx, "valruns:{default}:ready", 0, -1).Result()
	if err != nil {
		return 0, "", err
	}
	isB := map[string]bool{}
	for _, o := range bOps {
		isB[o.RunID] = true
	}
	aAhead, most, worst, found := 0, 0, "", 0
	for _, raw := range items {
		var it struct {
			Run struct {
				RunID string `json:"run_id"`
				OrgID string `json:"org_id"`
			} `json:"run"`
		}
		if err := json.Unmarshal([]byte(raw), &it); err != nil {
			return 0, "", fmt.Errorf("item %q: %w", raw, err)
		}
		switch {
		case isB[it.Run.RunID]:
			found++
			if aAhead >= most {
				most, worst = aAhead, it.Run.RunID
			}
		case it.Run.OrgID == a:
			aAhead++
		}
	}
	if found < len(isB) {
		return 0, "", fmt.Errorf("%d of B's %d runs are in the ready list: the API had not handed them all off", found, len(isB))
	}
	return most, worst, nil
}

// startPaced sends ops one at a time, noisyPause apart, and returns how
// long each took to its definitive answer (retries included).
func startPaced(ctx context.Context, cl *client, ops []*op) []time.Duration {
	lat := make([]time.Duration, 0, len(ops))
	for i, o := range ops {
		t0 := time.Now()
		o.finish(cl.do(ctx, o.request(), i))
		lat = append(lat, time.Since(t0))
		time.Sleep(noisyPause)
	}
	return lat
}

// fairnessCounts reads, for each of B's runs, A's runs queued ahead of it
// (created before it and not yet started when it was created) and, of
// those, the ones that started before it. It returns the largest of each
// and B's run with the most A runs started first. The runs' timestamps all
// come from the database's clock; it is an ordering, not a duration.
func fairnessCounts(t *testing.T, c *cluster, a org, bOps []*op) (ahead, ranFirst int, worst string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, o := range bOps {
		if o.RunID == "" {
			continue // verify has reported it
		}
		var q, first int
		err := c.db.QueryRowContext(ctx, `SELECT
			count(*) FILTER (WHERE a.started_at IS NULL OR a.started_at > b.created_at),
			count(*) FILTER (WHERE a.started_at > b.created_at AND a.started_at < b.started_at)
			FROM validation_runs b JOIN validation_runs a ON a.org_id = $2 AND a.created_at < b.created_at
			WHERE b.id = $1`, o.RunID, a.ID).Scan(&q, &first)
		if err != nil {
			t.Fatalf("count A's runs ahead of B's run %s: %v", o.RunID, err)
		}
		ahead = max(ahead, q)
		if worst == "" || first > ranFirst {
			ranFirst, worst = first, o.RunID
		}
	}
	return ahead, ranFirst, worst
}

// startToFinal is finished_at - created_at of each operation's run.
func startToFinal(t *testing.T, c *cluster, ops []*op) []time.Duration {
	t.Helper()
	var out []time.Duration
	for _, o := range ops {
		var secs float64
		if o.RunID == "" {
			continue
		}
		if err := c.db.QueryRow(`SELECT extract(epoch FROM finished_at - created_at) FROM validation_runs
			WHERE id = $1 AND finished_at IS NOT NULL`, o.RunID).Scan(&secs); err == nil {
			out = append(out, time.Duration(secs*float64(time.Second)))
		}
	}
	return out
}

// pct is the q-quantile of ds, nearest rank (0 when empty).
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(q*float64(len(s))+0.999999999) - 1
	return s[max(0, min(rank, len(s)-1))]
}

func msText(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }

// figure records a measured figure for the report: shown, never asserted.
func (r *result) figure(format string, args ...any) {
	r.Figures = append(r.Figures, strings.TrimSpace(fmt.Sprintf(format, args...)))
}
