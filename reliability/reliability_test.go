package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valruns/valruns/internal/proctest"
)

func TestMain(m *testing.M) { os.Exit(proctest.Run(m)) }

// scenario is one fault the suite injects, run on its own fresh database.
type scenario struct {
	name string
	run  func(t *testing.T, s *suite, res *result)
}

var scenarios = []scenario{
	{"retry_storm", retryStorm},
	{"api_replica_kill", apiReplicaKill},
	{"postgres_restart", postgresRestart},
	{"redis_restart", redisRestart},
	{"worker_kill", workerKill},
	{"worker_kill_fast", workerKillFast},
	{"worker_pause", workerPause},
	{"worker_pause_fast", workerPauseFast},
	{"worker_starved", workerStarved},
	{"hostile_input", hostileInput},
	{"overload_memory", overloadMemory},
	{"overload_retrying", overloadRetrying},
	{"tenant_probing", tenantProbing},
	{"noisy_neighbour", noisyNeighbour},
	{"pgbouncer", pgbouncerScenario},
	{"sentinel_failover", sentinelFailover},
	{"pg_failover", pgFailover},
	{"webhook_outage", webhookOutageScenario},
	{"webhook_attempt_kill", webhookAttemptKill},
}

// TestReliability runs every scenario in turn (they share the private
// PostgreSQL and Redis, which some of them restart) and prints one row per
// scenario; RELIABILITY_OUT=path also writes the table there in Markdown.
func TestReliability(t *testing.T) {
	started := time.Now()
	s := newSuite(t)
	var results []*result
	t.Cleanup(func() { report(t, results, time.Since(started)) })
	for _, sc := range scenarios {
		res := &result{Name: sc.name}
		results = append(results, res)
		t.Run(sc.name, func(t *testing.T) {
			res.Ran = true
			defer func() { res.Failed = t.Failed() }()
			sc.run(t, s, res)
		})
	}
}

// report prints the table and writes it to RELIABILITY_OUT when set.
func report(t *testing.T, results []*result, took time.Duration) {
	var b strings.Builder
	b.WriteString("| scenario | result | logical ops | HTTP requests | 5xx expected / unexpected | runs | duplicates | losses | stranded | errored | recovery |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range results {
		if !r.Ran {
			continue
		}
		status := "pass"
		if r.Failed {
			status = "**FAIL**"
		}
		recovery := "n/a"
		switch {
		case r.NotRecovered:
			recovery = "not recovered"
		case r.faultInjection:
			recovery = fmt.Sprintf("%.1f s", r.Recovery.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d / %d | %d | %d | %d | %d | %d | %s |\n", r.Name, status, r.Ops, r.Requests,
			r.Expected5xx, r.Unexpected5xx, r.Runs, r.Duplicates, r.Losses, r.Stranded, r.Errored, recovery)
	}
	fmt.Fprintf(&b, "\nSuite time: %s on %d CPUs.\n", took.Round(time.Second), runtime.NumCPU())
	var figures strings.Builder
	for _, r := range results {
		for _, f := range r.Figures {
			fmt.Fprintf(&figures, "- **%s**: %s\n", r.Name, f)
		}
	}
	if figures.Len() > 0 {
		b.WriteString("\nMeasured, reported and never asserted:\n\n" + figures.String())
	}
	var notes strings.Builder
	for _, r := range results {
		if len(r.Notes) == 0 {
			continue
		}
		fmt.Fprintf(&notes, "\n- **%s**:\n", r.Name)
		for _, n := range r.Notes {
			fmt.Fprintf(&notes, "  - %s\n", strings.ReplaceAll(n, "|", `\|`))
		}
	}
	if notes.Len() > 0 {
		b.WriteString("\nWhy scenarios failed (first messages of each):\n")
		b.WriteString(notes.String())
	}
	t.Logf("fault suite report:\n\n%s", b.String())
	if out := os.Getenv("RELIABILITY_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Errorf("RELIABILITY_OUT: %v", err)
		}
	}
}

// load runs operations on a pool of client goroutines.
type load struct {
	ops  []*op
	done atomic.Int64
	wg   sync.WaitGroup
}

// startLoad sends ops with `workers` concurrent clients; operation i starts
// on replica i mod the replica count.
func startLoad(ctx context.Context, cl *client, ops []*op, workers int) *load {
	l := &load{ops: ops}
	next := make(chan int, len(ops))
	for i := range ops {
		next <- i
	}
	close(next)
	for range workers {
		l.wg.Go(func() {
			for i := range next {
				o := ops[i]
				o.finish(cl.do(ctx, o.request(), i))
				l.done.Add(1)
			}
		})
	}
	return l
}

func (l *load) wait() { l.wg.Wait() }

// waitUntil polls cond until it holds or timeout passes.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// createWorkflow creates def for o through the API, computes what its runs
// must yield and returns its id.
func createWorkflow(t *testing.T, cl *client, o org, def *workflowDef) string {
	t.Helper()
	def.compute(t)
	out := cl.do(context.Background(), request{Method: "POST", Path: "/api/workflows/", Key: "wf-" + def.Name,
		Body: def.createBody(), Token: o.Token}, 0)
	if !out.Definitive || out.Final.Status != 201 {
		t.Fatalf("create workflow %s: %+v", def.Name, lastOf(out))
	}
	var w struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(out.Final.Body, &w); err != nil || w.ID == "" {
		t.Fatalf("create workflow %s: %s", def.Name, clip(out.Final.Body))
	}
	return w.ID
}

// lastOf describes an outcome's last answer for messages.
func lastOf(out outcome) string {
	if out.Final == nil {
		if n := len(out.Attempts); n > 0 {
			return "no answer: " + out.Attempts[n-1].Err
		}
		return "no answer"
	}
	return fmt.Sprintf("%d %s", out.Final.Status, clip(out.Final.Body))
}

// makeOps builds n operations of org o on the workflow, cycling through
// its submissions.
func makeOps(prefix string, n int, o org, wfID string, def *workflowDef) []*op {
	ops := make([]*op, n)
	for i := range ops {
		ops[i] = &op{Key: fmt.Sprintf("%s-%04d", prefix, i), Org: o, Workflow: wfID, Def: def,
			Variant: def.Variants[i%len(def.Variants)]}
	}
	return ops
}
