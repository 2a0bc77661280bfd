package tasks_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/tasks"
)

// execTracer counts what the worker sends PostgreSQL: statements, round
// trips, and the rows its writes changed (their command tags).
type execTracer struct {
	mu                    sync.Mutex
	on                    bool
	stmts, trips, written int
	sqls                  []string
}

func (tr *execTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.on {
		tr.stmts++
		tr.trips++
		tr.sqls = append(tr.sqls, d.SQL)
	}
	return context.WithValue(ctx, endsRunsKey{}, strings.HasPrefix(strings.TrimSpace(d.SQL), "WITH done AS (UPDATE validation_runs"))
}

// endsRunsKey marks, in a statement's context, a statement that ends runs:
// an UPDATE in a CTE (with the webhook outbox's INSERT beside it) whose
// answer is the ids of the runs it ended, so its command tag says SELECT
// and counts the runs it wrote.
type endsRunsKey struct{}

func (tr *execTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	endsRuns, _ := ctx.Value(endsRunsKey{}).(bool)
	if tr.on && (d.CommandTag.Update() || d.CommandTag.Insert() || d.CommandTag.Delete() || (endsRuns && d.CommandTag.Select())) {
		tr.written += int(d.CommandTag.RowsAffected())
	}
}

// The worker's batched end goes as a pipeline (models' pipe): a batch of
// statements, one round trip.
func (tr *execTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.on {
		tr.trips++
	}
	return ctx
}

func (tr *execTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if !tr.on {
		return
	}
	tr.stmts++
	tr.sqls = append(tr.sqls, d.SQL)
	if d.Err == nil && (d.CommandTag.Update() || d.CommandTag.Insert() || d.CommandTag.Delete() ||
		strings.HasPrefix(strings.TrimSpace(d.SQL), "WITH done AS (UPDATE validation_runs") && d.CommandTag.Select()) {
		tr.written += int(d.CommandTag.RowsAffected())
	}
}

func (tr *execTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (tr *execTracer) set(on bool) (stmts, trips, written int, sqls []string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	stmts, trips, written, sqls = tr.stmts, tr.trips, tr.written, tr.sqls
	tr.on, tr.stmts, tr.trips, tr.written, tr.sqls = on, 0, 0, 0, nil
	return
}

// TestStatementsPerExecution measures what executing a run costs the
// database on the fast path, and fails if it grows: one statement (with
// its setting), one round trip and one row written per run handed off
// alone (its final write, from queued to final, with its findings), and
// one statement for all the runs of a batch task. (TestStatementsPerRequest in handlers does
// the same for a start.)
func TestStatementsPerExecution(t *testing.T) {
	t.Parallel()
	tr := &execTracer{}
	env := apitest.New(t, apitest.Options{Tracer: tr})
	org := env.NewOrg("acme")
	wf := env.NewWorkflow(org, orderWorkflow)
	w := newWorker(t, env, idleRedis(), nil)
	ctx := context.Background()
	store := models.NewRunStore(env.DB)
	queued := func(n int) []*models.QueuedRun {
		qs := make([]*models.QueuedRun, n)
		for i := range qs {
			body := validOrder
			if i%2 == 1 {
				body = invalidOrder
			}
			q, err := store.Queued(ctx, startRun(t, env, org, wf, body))
			require.NoError(t, err)
			qs[i] = q
		}
		return qs
	}
	// Warm up: the worker compiles the workflow once (a read of its rules).
	require.NoError(t, w.Mux().ProcessTask(ctx, tasks.NewRunTaskFor(queued(1)[0])))

	const n = 6
	singles, batch := queued(n), queued(n)
	listed := func() (c int64) {
		var ids []string
		for _, q := range append(singles, batch...) {
			ids = append(ids, q.ID)
		}
		require.NoError(t, env.DB.Raw(`SELECT count(*) FROM unfinished_runs WHERE id = ANY(CAST(? AS uuid[]))`,
			"{"+strings.Join(ids, ",")+"}").Row().Scan(&c))
		return c
	}
	require.EqualValues(t, 2*n, listed(), "each queued run is listed as unfinished, for the sweeper")
	tr.set(true)
	for _, q := range singles {
		require.NoError(t, w.Mux().ProcessTask(ctx, tasks.NewRunTaskFor(q)))
	}
	stmts, trips, written, sqls := tr.set(true)
	require.NoError(t, w.Mux().ProcessTask(ctx, tasks.NewBatchTaskFor(batch)))
	bStmts, bTrips, bWritten, bSQL := tr.set(false)
	for _, q := range append(singles, batch...) {
		require.Contains(t, []string{"passed", "failed"}, readRun(t, env, q.ID).Status)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\n%-28s %10s %11s %12s\n", "execution, per run", "statements", "round trips", "rows written")
	fmt.Fprintf(&b, "%-28s %10.2f %11.2f %12.2f\n", "alone (fast path)", float64(stmts)/n, float64(trips)/n, float64(written)/n)
	fmt.Fprintf(&b, "%-28s %10.2f %11.2f %12.2f\n", fmt.Sprintf("in a batch of %d", n), float64(bStmts)/n, float64(bTrips)/n, float64(bWritten)/n)
	b.WriteString("(rows written: the run's; the same statement deletes its row in unfinished_runs, checked below)\n")
	t.Log(b.String())
	// The end and its own setting (sequential scans off: see
	// models.FinishUnclaimed), sent together.
	require.Equal(t, 2*n, stmts, "one statement per run, with its setting: %q", sqls)
	require.Equal(t, n, trips, "one round trip per run")
	require.Equal(t, n, written, "one row written per run: the run, once")
	require.Zero(t, listed(), "the statement that ends a run unlists it")
	require.Equal(t, 2, bStmts, "one statement for the whole batch, with its setting: %q", bSQL)
	require.Equal(t, 1, bTrips)
	require.Equal(t, n, bWritten, "one row written per run")
}
