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

// execTracer counts what the worker sends PostgreSQL: statements and
// round trips.
type execTracer struct {
	mu           sync.Mutex
	on           bool
	stmts, trips int
	sqls         []string
}

func (tr *execTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.on {
		tr.stmts++
		tr.trips++
		tr.sqls = append(tr.sqls, d.SQL)
	}
	return ctx
}

func (tr *execTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

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
	if tr.on {
		tr.stmts++
		tr.sqls = append(tr.sqls, d.SQL)
	}
}

func (tr *execTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (tr *execTracer) set(on bool) (stmts, trips int, sqls []string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	stmts, trips, sqls = tr.stmts, tr.trips, tr.sqls
	tr.on, tr.stmts, tr.trips, tr.sqls = on, 0, 0, nil
	return
}

// nextXid is the id PostgreSQL gives the next transaction that writes, in
// the 32 bits a row's xmin holds.
func nextXid(t *testing.T, env *apitest.Env) int64 {
	t.Helper()
	var x int64
	require.NoError(t, env.DB.Raw(`SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint % 4294967296`).Row().Scan(&x))
	return x
}

// rowsWritten counts, in every table of the test's database, the row
// versions that transactions from (inclusive) to to (exclusive) stored:
// each row they inserted, and the new version of each row they updated
// (xmin), whatever their statements answered. By table, and in all.
func rowsWritten(t *testing.T, env *apitest.Env, from, to int64) (map[string]int64, int64) {
	t.Helper()
	var tables []string
	require.NoError(t, env.DB.Raw(`SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables`).Scan(&tables).Error)
	by, all := map[string]int64{}, int64(0)
	for _, table := range tables {
		var n int64
		require.NoError(t, env.DB.Raw(`SELECT count(*) FROM `+table+` WHERE xmin::text::bigint >= ? AND xmin::text::bigint < ?`, from, to).Row().Scan(&n))
		if n > 0 {
			by[table] = n
			all += n
		}
	}
	return by, all
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
	require.NoError(t, tasks.Deliver(ctx, w.Worker, tasks.NewRunTaskFor(queued(1)[0])))

	const n = 6
	singles := queued(n)
	listed := func() (c int64) {
		var ids []string
		for _, q := range singles {
			ids = append(ids, q.ID)
		}
		require.NoError(t, env.DB.Raw(`SELECT count(*) FROM unfinished_runs WHERE id = ANY(CAST(? AS uuid[]))`,
			"{"+strings.Join(ids, ",")+"}").Row().Scan(&c))
		return c
	}
	require.EqualValues(t, n, listed(), "each queued run is listed as unfinished, for the sweeper")
	x0 := nextXid(t, env)
	tr.set(true)
	for _, q := range singles {
		require.NoError(t, tasks.Deliver(ctx, w.Worker, tasks.NewRunTaskFor(q)))
	}
	stmts, trips, sqls := tr.set(false)
	x1 := nextXid(t, env)
	writtenBy, written := rowsWritten(t, env, x0, x1)
	for _, q := range singles {
		require.Contains(t, []string{"passed", "failed"}, readRun(t, env, q.ID).Status)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\n%-28s %10s %11s %12s\n", "execution, per run", "statements", "round trips", "rows written")
	fmt.Fprintf(&b, "%-28s %10.2f %11.2f %12.2f\n", "alone (fast path)", float64(stmts)/n, float64(trips)/n, float64(written)/n)
	b.WriteString("(rows written: row versions stored, by their xmin; the same statement deletes the run's row in unfinished_runs, checked below)\n")
	t.Log(b.String())
	// The end and its own setting (sequential scans off: see
	// models.FinishUnclaimed), sent together.
	require.Equal(t, 2*n, stmts, "one statement per run, with its setting: %q", sqls)
	require.Equal(t, n, trips, "one round trip per run")
	require.Equal(t, map[string]int64{"public.validation_runs": n}, writtenBy, "one row written per run: the run, once")
	require.Zero(t, listed(), "the statement that ends a run unlists it")
	// Named as models loads them: the runs end by sql/finish_unclaimed.sql.
	ends := func(sqls []string) (k int) {
		for _, q := range sqls {
			if q == models.Statement("finish_unclaimed") {
				k++
			}
		}
		return k
	}
	require.Equal(t, n, ends(sqls), "each run alone ends by finish_unclaimed: %q", sqls)
}
