package tasks_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/validate"
)

// scanWorkflow is a heavy but allowed workflow: scans assertions, each a
// loop over the submission's list, so a worker spends its time inside
// assertions. scanSubmission is a list of n ones, with -1 at the end when
// invalid (every assertion then fails).
func scanWorkflow(scans int) map[string]any {
	as := make([]map[string]any, scans)
	for i := range as {
		as[i] = map[string]any{"name": fmt.Sprintf("scan_%02d", i), "expr": "submission.xs.all(x, x >= 0)",
			"severity": "error", "message": fmt.Sprintf("scan %d found a negative number", i)}
	}
	return map[string]any{"name": "scans", "assertions": as}
}

func scanSubmission(n int, invalid bool) map[string]any {
	xs := make([]int, n)
	for i := range xs {
		xs[i] = 1
	}
	if invalid {
		xs[n-1] = -1
	}
	return map[string]any{"submission": map[string]any{"xs": xs}}
}

// Issue 14: a worker stopped (SIGSTOP) in the middle of runs, for longer
// than their lease and than the validation's time limits, ended them in
// error on SIGCONT, blaming the submissions, and wrote to runs it no longer
// held. Here the worker process is stopped while it validates runs of a
// heavy workflow, for RUN_LEASE plus EvalTimeout and more, then continued.
// Every run ends as an unpaused run does (passed, or failed with the same
// findings), none in error; every run the worker held at the stop is
// finished by a later delivery (attempts >= 2): the stale delivery, whose
// lease ran out, wrote nothing.
func TestWorkerPausedPastItsLeaseEndsRunsAsUnpaused(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t)
	env := apitest.New(t)
	org := env.NewOrg("acme")
	const scans, items, runs = 30, 20_000, 8
	def := scanWorkflow(scans)
	wf := env.NewWorkflow(org, def)

	// What an unpaused worker makes of each submission.
	var assertions []validate.Assertion
	for _, a := range def["assertions"].([]map[string]any) {
		assertions = append(assertions, validate.Assertion{Name: a["name"].(string), Expr: a["expr"].(string),
			Severity: a["severity"].(string), Message: a["message"].(string)})
	}
	prog, _, err := validate.Compile(nil, assertions)
	require.NoError(t, err)
	want := map[bool][]finding{}
	for _, invalid := range []bool{false, true} {
		fs, err := prog.Run(context.Background(), []byte(fmt.Sprintf(`{"xs": [%s]}`,
			strings.TrimSuffix(strings.Repeat("1,", items-1), ",")+map[bool]string{false: ",1", true: ",-1"}[invalid])), nil)
		require.NoError(t, err)
		for _, f := range fs {
			want[invalid] = append(want[invalid], finding{Step: f.Step, Severity: f.Severity, Path: f.Path, Message: f.Message})
		}
	}
	require.Empty(t, want[false])
	require.Len(t, want[true], scans)

	invalid := map[string]bool{}
	for i := range runs {
		invalid[startRun(t, env, org, wf, scanSubmission(items, i%2 == 1))] = i%2 == 1
	}
	const lease = 2 * time.Second
	w := startWorkerProcess(t, bin, env.DBURL, redisURL(newRedis(t)), "RUN_LEASE="+lease.String(),
		"RUN_SWEEP_INTERVAL=200ms", "RUN_REDELIVER_AFTER=500ms", "WORKER_CONCURRENCY=2",
		"RUN_FAST_PATH=0") // every run claimed: this is about a delivery whose lease ran out

	// Stop it once it is under way: a run finished, others running. A stop
	// may catch it holding no run (each had just finished): then it is
	// continued, runs are added when none is left, and it is stopped again.
	var held []string
	deadline := time.Now().Add(3 * time.Minute)
	for stop := 1; len(held) == 0; stop++ {
		require.True(t, time.Now().Before(deadline), "after %d stops, none caught the worker holding a run", stop-1)
		if env.Count("validation_runs", "status IN ('queued', 'running')") == 0 {
			for i := range 4 {
				invalid[startRun(t, env, org, wf, scanSubmission(items, i%2 == 1))] = i%2 == 1
			}
		}
		apitest.Eventually(t, 2*time.Minute, func() bool {
			return env.Count("validation_runs", "status IN ('passed', 'failed', 'error')") >= 1 &&
				env.Count("validation_runs", "status = 'running'") >= 1
		}, "the worker validates runs")
		require.NoError(t, w.cmd.Process.Signal(syscall.SIGSTOP))
		apitest.Eventually(t, 10*time.Second, func() bool {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", w.cmd.Process.Pid))
			require.NoError(t, err)
			_, after, _ := strings.Cut(string(stat), ") ")
			return strings.HasPrefix(after, "T")
		}, "the worker is stopped")
		// A statement the worker sent before it stopped still runs in its
		// backend, and commits (a write sent while the lease was live passed the
		// fence): give its backend a moment to read it, then wait until no
		// statement of another session is under way. (One that arrives even
		// later is told apart below, by when it committed.)
		time.Sleep(500 * time.Millisecond)
		apitest.Eventually(t, 30*time.Second, func() bool {
			return env.Count("pg_stat_activity", "datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'") == 0
		}, "the stopped worker's statements are over")
		// Not a run whose Finish transaction is open (its row locked): that
		// write passed the fence while the lease was live, and commits on SIGCONT.
		require.NoError(t, env.DB.Raw(`SELECT id FROM validation_runs WHERE status = 'running' FOR SHARE SKIP LOCKED`).Scan(&held).Error)
		if len(held) == 0 {
			t.Logf("stop %d caught the worker holding no run: continued, to be stopped again", stop)
			require.NoError(t, w.cmd.Process.Signal(syscall.SIGCONT))
		}
	}
	// Longer than the lease and than a validation's time limits: the clock
	// runs, the worker does nothing.
	time.Sleep(lease + max(validate.EvalTimeout, validate.SchemaTimeout) + time.Second)
	resumed := time.Now()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGCONT))
	t.Logf("worker stopped holding %d runs", len(held))

	for id, bad := range invalid {
		run := waitRun(t, env, org, id, 2*time.Minute)
		wantStatus := map[bool]string{false: "passed", true: "failed"}[bad]
		require.Equal(t, wantStatus, run.Status, "run %s (error: %v)", id, run.Error)
		got := dbFindings(t, env, id)
		if len(got) == 0 {
			got = nil // [] as stored: none
		}
		require.Equal(t, want[bad], got, "run %s: findings written once, as unpaused", id)
	}
	for _, id := range held {
		r := readRun(t, env, id)
		if r.Attempts >= 2 {
			continue // taken over by a later delivery
		}
		// Finished by the held attempt: only by a statement sent before the
		// stop (committed while the worker could send nothing), never after.
		require.NotNil(t, r.FinishedAt)
		require.True(t, r.FinishedAt.Before(resumed),
			"run %s, held by the stopped worker, was finished by its stale delivery at %s, after SIGCONT (%s)", id, r.FinishedAt, resumed)
		t.Logf("run %s: the statement ending it was on its way at the stop, and committed while the lease was live", id)
	}
}
