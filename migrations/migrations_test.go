package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

// contractTables is every table (or view) of the schema: those the
// idempotency contract (docs/api.md, #idempotency) first named, less what migration 0004 (the lean run) folded into the runs: findings
// (a column), staged_jobs (the run row is the outbox), and audit_records
// (now a view over the runs).
var contractTables = []string{
	"api_tokens",
	"audit_records",
	"idempotency_keys",
	"organizations",
	"usage_slots",
	"validation_runs",
	"workflows",
}

// emptyDB is a fresh unmigrated database.
func emptyDB(t *testing.T) *sql.DB {
	t.Helper()
	db, _ := testdb.New(t, testdb.Options{Empty: true})
	return models.SQLDB(db)
}

// tables lists the contract tables present in the public schema, sorted.
func tables(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `
		SELECT table_name FROM information_schema.tables
		WHERE table_schema = 'public' AND table_type IN ('BASE TABLE', 'VIEW') AND table_name = ANY($1)
		ORDER BY table_name`, contractTables)
	require.NoError(t, err)
	defer rows.Close()
	var got []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		got = append(got, name)
	}
	require.NoError(t, rows.Err())
	return got
}

// indexDef returns the definition of the index on table whose definition
// contains all of parts, or "" when there is none.
func indexDef(t *testing.T, db *sql.DB, table string, parts ...string) string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(),
		`SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = $1`, table)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var def string
		require.NoError(t, rows.Scan(&def))
		all := true
		for _, p := range parts {
			all = all && strings.Contains(def, p)
		}
		if all {
			return def
		}
	}
	require.NoError(t, rows.Err())
	return ""
}

func pending(t *testing.T, db *sql.DB) int {
	t.Helper()
	n, err := migrations.Pending(context.Background(), db)
	require.NoError(t, err)
	return n
}

// migrationFiles lists the embedded migrations in order.
func migrationFiles(t *testing.T) []string {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	sort.Strings(files)
	return files
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	files := migrationFiles(t)

	require.Equal(t, len(files), pending(t, db), "an empty database has every migration pending")
	require.Empty(t, tables(t, db))

	for round := 1; round <= 2; round++ {
		res, err := p.Up(ctx)
		require.NoError(t, err, "up, round %d", round)
		require.Len(t, res, len(files), "round %d", round)
		for i, r := range res {
			require.Equal(t, files[i], r.Source.Path)
			require.NoError(t, r.Error)
		}
		v, err := p.GetDBVersion(ctx)
		require.NoError(t, err)
		require.EqualValues(t, len(files), v)
		require.Equal(t, 0, pending(t, db), "round %d", round)
		if d := cmp.Diff(contractTables, tables(t, db)); d != "" {
			t.Fatalf("round %d: tables after up (-want +got):\n%s", round, d)
		}

		// Up again is a no-op.
		res, err = p.Up(ctx)
		require.NoError(t, err)
		require.Empty(t, res)

		// Keys are partitioned by expiry (migration 0012): the primary key
		// holds expires_at, and one live row per scoped key rests on the
		// key's lock (docs/design.md).
		unique := indexDef(t, db, "idempotency_keys", "UNIQUE INDEX", "(org_id, endpoint, key, expires_at)")
		require.NotEmpty(t, unique, "round %d: primary key on idempotency_keys (org_id, endpoint, key, expires_at)", round)
		var partKey string
		require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_get_partkeydef(CAST('idempotency_keys' AS regclass))`).Scan(&partKey))
		require.Equal(t, "RANGE (expires_at)", partKey, "round %d", round)

		down, err := p.DownTo(ctx, 0)
		require.NoError(t, err, "down, round %d", round)
		require.Len(t, down, len(files))
		require.Empty(t, tables(t, db), "round %d: tables left after DownTo(0)", round)
		require.Empty(t, indexDef(t, db, "idempotency_keys", "(expires_at)"))
		require.Equal(t, len(files), pending(t, db), "round %d: every migration pending again after DownTo(0)", round)
	}
}

// Migration 0002 moves what usage_counters counted into usage_slots (slot 0,
// not balanced yet, so the next start rebalances it for its quota), and its
// Down moves it back: nothing billed is lost either way.
func TestUsageCarriedOverSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 1)
	require.NoError(t, err)
	var orgID string
	require.NoError(t, db.QueryRowContext(ctx,
		`INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&orgID))
	_, err = db.ExecContext(ctx, `INSERT INTO usage_counters (org_id, period, runs) VALUES ($1, '2026-10-01', 7), ($1, '2026-11-01', 42)`, orgID)
	require.NoError(t, err)

	_, err = p.UpTo(ctx, 2)
	require.NoError(t, err)
	usage := func(table string) map[string]int64 {
		rows, err := db.QueryContext(ctx, `SELECT to_char(period, 'YYYY-MM'), sum(runs) FROM `+table+` WHERE org_id = $1 GROUP BY period`, orgID)
		require.NoError(t, err)
		defer rows.Close()
		out := map[string]int64{}
		for rows.Next() {
			var period string
			var runs int64
			require.NoError(t, rows.Scan(&period, &runs))
			out[period] = runs
		}
		require.NoError(t, rows.Err())
		return out
	}
	want := map[string]int64{"2026-10": 7, "2026-11": 42}
	require.Equal(t, want, usage("usage_slots"))
	var unbalanced int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM usage_slots WHERE quota = -1`).Scan(&unbalanced))
	require.Equal(t, 2, unbalanced, "carried-over slots wait to be balanced")

	_, err = p.DownTo(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, want, usage("usage_counters"))
}

func TestConstraints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.Up(ctx)
	require.NoError(t, err)

	var orgID, wfID string
	require.NoError(t, db.QueryRowContext(ctx,
		`INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&orgID))
	require.NoError(t, db.QueryRowContext(ctx,
		`INSERT INTO workflows (org_id, name) VALUES ($1, 'wf') RETURNING id`, orgID).Scan(&wfID))

	const insertKey = `INSERT INTO idempotency_keys
		(org_id, endpoint, key, request_hash, request_method, request_path, response_status,
		 response_body, request_id, expires_at)
		VALUES ($1, $2, $3, sha256('x'::bytea), 'POST', '/p', 201, '\x7b7d', 'req', now() + interval '1 day')`
	const insertRun = `INSERT INTO validation_runs (org_id, workflow_id, status, submission, metadata, finished_at, error)
		VALUES ($1, $2, $3, '{}', $4::jsonb, $5, $6)`

	tests := []struct {
		name string
		sql  string
		args []any
		// wantCode is the SQLSTATE expected; "" means the insert succeeds.
		wantCode string
	}{
		{name: "key of 255 characters", sql: insertKey, args: []any{orgID, "workflow_start", strings.Repeat("k", 255)}},
		{name: "key of 256 characters", sql: insertKey, args: []any{orgID, "workflow_start", strings.Repeat("k", 256)}, wantCode: "23514"},
		{name: "empty key", sql: insertKey, args: []any{orgID, "workflow_start", ""}, wantCode: "23514"},
		// A second row of a scoped key, of another expiry: the key's lock,
		// not an index, keeps one live (migration 0012).
		{name: "same org, endpoint and key", sql: insertKey, args: []any{orgID, "workflow_start", strings.Repeat("k", 255)}},
		{name: "same key, other endpoint", sql: insertKey, args: []any{orgID, "workflow_create", strings.Repeat("k", 255)}},
		{name: "queued run", sql: insertRun, args: []any{orgID, wfID, "queued", "{}", nil, nil}},
		{name: "unknown status", sql: insertRun, args: []any{orgID, wfID, "done", "{}", nil, nil}, wantCode: "23514"},
		{name: "passed without finished_at", sql: insertRun, args: []any{orgID, wfID, "passed", "{}", nil, nil}, wantCode: "23514"},
		{name: "error without error text", sql: insertRun, args: []any{orgID, wfID, "error", "{}", "2026-01-01T00:00:00Z", nil}, wantCode: "23514"},
		{name: "metadata not an object", sql: insertRun, args: []any{orgID, wfID, "queued", "[1]", nil, nil}, wantCode: "23514"},
		// The start's statement checks the workflow is the organisation's;
		// the runs table has no foreign key to workflows (migration 0009).
		{name: "run of an unknown workflow", sql: insertRun, args: []any{orgID, "00000000-0000-0000-0000-000000000000", "queued", "{}", nil, nil}},
		// The key's link to its run has no foreign key (migration 0012: a
		// partition holding one could not be dropped without locking the
		// runs); valruns deletes no run.
		{name: "key linked to an unknown run", sql: `INSERT INTO idempotency_keys
			(org_id, endpoint, key, request_hash, request_method, request_path, response_status,
			 response_body, request_id, expires_at, validation_run_id)
			VALUES ($1, 'workflow_start', 'linked', sha256('x'::bytea), 'POST', '/p', 201, '\x7b7d', 'req', now() + interval '1 day',
			 '00000000-0000-0000-0000-000000000000')`, args: []any{orgID}},
		{name: "key past the partitions made", sql: `INSERT INTO idempotency_keys
			(org_id, endpoint, key, request_hash, request_method, request_path, response_status,
			 response_body, request_id, expires_at)
			VALUES ($1, 'workflow_start', 'far', sha256('x'::bytea), 'POST', '/p', 201, '\x7b7d', 'req', now() + interval '1 year')`,
			args: []any{orgID}, wantCode: "23514"},
		{name: "bad slug", sql: `INSERT INTO organizations (name, slug) VALUES ('x', 'Not A Slug')`, wantCode: "23514"},
		{name: "token hash not 32 bytes", sql: `INSERT INTO api_tokens (org_id, token_hash, display) VALUES ($1, '\x00', 'vr_x')`, args: []any{orgID}, wantCode: "23514"},
		{name: "usage period not the first of a month", sql: `INSERT INTO usage_slots (org_id, period, slot, quota) VALUES ($1, '2026-01-02', 0, 0)`, args: []any{orgID}, wantCode: "23514"},
	}
	// Sequential: rows of earlier cases (the 255-character key) are what later ones collide with.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := db.ExecContext(ctx, tt.sql, tt.args...)
			if tt.wantCode == "" {
				require.NoError(t, err)
				return
			}
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "want SQLSTATE %s, got %v", tt.wantCode, err)
			require.Equal(t, tt.wantCode, pgErr.Code, pgErr.Message)
		})
	}
}

// Migration 0004 (the lean run) keeps what was written: findings rows
// become the run's findings column, audit records the columns of the runs
// the view shows, a key's link to its run is kept both ways; and its Down
// gives them back, with a staged job for each run not final.
func TestLeanRunMigrationKeepsData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 3)
	require.NoError(t, err)
	var org, wf, token, done, queued, key string
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&org))
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO workflows (org_id, name) VALUES ($1, 'wf') RETURNING id`, org).Scan(&wf))
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO api_tokens (org_id, token_hash, display) VALUES ($1, sha256('t'), 't') RETURNING id`, org).Scan(&token))
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO validation_runs (org_id, workflow_id, status, submission, finished_at)
		VALUES ($1, $2, 'failed', '{"a": 1}', now()) RETURNING id`, org, wf).Scan(&done))
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO validation_runs (org_id, workflow_id, submission)
		VALUES ($1, $2, '{"b": 2}') RETURNING id`, org, wf).Scan(&queued))
	_, err = db.ExecContext(ctx, `INSERT INTO findings (run_id, position, step, severity, path, message) VALUES
		($1, 1, 'assertion:x', 'warning', '', 'second'), ($1, 0, 'schema', 'error', '/a', 'first')`, done)
	require.NoError(t, err)
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO idempotency_keys (org_id, endpoint, key, request_hash, request_method,
		request_path, response_status, response_body, validation_run_id, request_id, expires_at)
		VALUES ($1, 'workflow_start', 'k1', sha256('r'), 'POST', '/p', 201, 'x', $2, 'req-1', now() + interval '1 day') RETURNING id`,
		org, done).Scan(&key))
	_, err = db.ExecContext(ctx, `UPDATE validation_runs SET idempotency_key_id = $1 WHERE id = $2`, key, done)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO audit_records (org_id, action, subject_type, subject_id, token_id, request_id)
		SELECT org_id, 'validation_run.start', 'validation_run', id, $2, 'req-' || id FROM validation_runs WHERE org_id = $1`, org, token)
	require.NoError(t, err)

	_, err = p.UpTo(ctx, 4)
	require.NoError(t, err)
	var findings, idemKey string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT findings::text, idempotency_key FROM validation_runs WHERE id = $1`, done).Scan(&findings, &idemKey))
	require.JSONEq(t, `[{"step":"schema","severity":"error","path":"/a","message":"first"},
		{"step":"assertion:x","severity":"warning","path":"","message":"second"}]`, findings)
	require.Equal(t, "k1", idemKey)
	var audits int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM audit_records WHERE token_id = $1 AND request_id = 'req-' || subject_id`, token).Scan(&audits))
	require.Equal(t, 2, audits, "the audit trail shows both runs, who started them and with which request")
	var linked string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT validation_run_id FROM idempotency_keys WHERE key = 'k1'`).Scan(&linked))
	require.Equal(t, done, linked)

	_, err = p.DownTo(ctx, 3)
	require.NoError(t, err)
	var rows, staged int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM findings WHERE run_id = $1 AND
		((position = 0 AND message = 'first') OR (position = 1 AND message = 'second'))`, done).Scan(&rows))
	require.Equal(t, 2, rows, "the findings rows are back, in order")
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM staged_jobs WHERE task_id = 'validation_run:' || $1`, queued).Scan(&staged))
	require.Equal(t, 1, staged, "the run not final is staged again")
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM validation_runs r JOIN idempotency_keys k ON k.id = r.idempotency_key_id
		WHERE r.id = $1 AND k.validation_run_id = r.id`, done).Scan(&rows))
	require.Equal(t, 1, rows, "the run and its key are linked both ways again")
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM audit_records WHERE token_id = $1`, token).Scan(&audits))
	require.Equal(t, 2, audits)
}

// Migration 0012 partitions the keys by day of expiry: the live keys move
// into the partitions (made for every day one expires in), the expired
// ones are left behind; its Down gives the live keys back to one table,
// with their links to their runs.
func TestKeyPartitionsMigrationKeepsLiveKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 11)
	require.NoError(t, err)
	var org, wf, run string
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&org))
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO workflows (org_id, name) VALUES ($1, 'wf') RETURNING id`, org).Scan(&wf))
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO validation_runs (org_id, workflow_id, submission) VALUES ($1, $2, '{}') RETURNING id`,
		org, wf).Scan(&run))
	_, err = db.ExecContext(ctx, `INSERT INTO idempotency_keys (org_id, endpoint, key, request_hash, request_method,
		request_path, response_status, response_body, validation_run_id, request_id, created_at, expires_at)
		VALUES ($1, 'workflow_start', 'live', sha256('r'), 'POST', '/p', 201, 'x', $2, 'req-1', now() - interval '1 hour', now() + interval '23 hours'),
		       ($1, 'workflow_start', 'long', sha256('r'), 'POST', '/p', 201, 'x', NULL, 'req-2', now(), now() + interval '6 days'),
		       ($1, 'workflow_start', 'old', sha256('r'), 'POST', '/p', 201, 'x', NULL, 'req-3', now() - interval '2 days', now() - interval '1 day')`,
		org, run)
	require.NoError(t, err)

	_, err = p.UpTo(ctx, 12)
	require.NoError(t, err)
	keys := func() []string {
		rows, err := db.QueryContext(ctx, `SELECT key FROM idempotency_keys ORDER BY key`)
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var k string
			require.NoError(t, rows.Scan(&k))
			out = append(out, k)
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Equal(t, []string{"live", "long"}, keys(), "the live keys, in their partitions")
	var linked string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT validation_run_id FROM idempotency_keys WHERE key = 'live'`).Scan(&linked))
	require.Equal(t, run, linked)

	_, err = p.DownTo(ctx, 11)
	require.NoError(t, err)
	require.Equal(t, []string{"live", "long"}, keys())
	require.NoError(t, db.QueryRowContext(ctx, `SELECT validation_run_id FROM idempotency_keys WHERE key = 'live'`).Scan(&linked))
	require.Equal(t, run, linked, "the link to the run, with its foreign key again")
	require.NotEmpty(t, indexDef(t, db, "idempotency_keys", "UNIQUE INDEX", "(org_id, endpoint, key)"))
}

// Migration 0010 lists the runs not final in unfinished_runs (queued and
// running, not a final one), and leaves validation_runs no index that holds
// a column a claim or a run's end changes, so that both can be HOT updates
// (no new index entries, issue 15): put the partial index on status back
// and this fails.
func TestUnfinishedRunsMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 9)
	require.NoError(t, err)
	var org, wf string
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&org))
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO workflows (org_id, name) VALUES ($1, 'wf') RETURNING id`, org).Scan(&wf))
	ids := map[string]string{}
	for _, st := range []string{"queued", "running", "passed"} {
		var id string
		require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO validation_runs (org_id, workflow_id, status, submission, finished_at)
			VALUES ($1, $2, $3, '{}', CASE WHEN $3 = 'passed' THEN now() END) RETURNING id`, org, wf, st).Scan(&id))
		ids[st] = id
	}

	_, err = p.UpTo(ctx, 10)
	require.NoError(t, err)
	var listed []string
	rows, err := db.QueryContext(ctx, `SELECT id FROM unfinished_runs ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		listed = append(listed, id)
	}
	require.NoError(t, rows.Err())
	require.ElementsMatch(t, []string{ids["queued"], ids["running"]}, listed, "the runs not final are listed, the final one not")

	// The columns a claim (runexec.go) or an end writes.
	changed := []string{"status", "attempts", "lease_expires_at", "error", "started_at", "finished_at", "findings", "redeliveries"}
	var defs []string
	rows, err = db.QueryContext(ctx, `SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'validation_runs'::regclass`)
	require.NoError(t, err)
	for rows.Next() {
		var def string
		require.NoError(t, rows.Scan(&def))
		defs = append(defs, def)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, defs)
	for _, def := range defs {
		for _, col := range changed {
			require.NotRegexp(t, `\b`+col+`\b`, def, "an index on a column a run's end changes makes every end a non-HOT update")
		}
	}
	var opts string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = 'validation_runs'::regclass`).Scan(&opts))
	require.Contains(t, opts, "fillfactor=70", "room on each page for a run's finished version")

	_, err = p.DownTo(ctx, 9)
	require.NoError(t, err)
	var idx int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_indexes WHERE indexname = 'validation_runs_unfinished_idx'`).Scan(&idx))
	require.Equal(t, 1, idx, "Down gives the sweeper's index back")
}

// Migration 0011 lets a test event's delivery name no run (and only a test
// event's), and adds the resend flag; its Down drops the test events and
// keeps every run's delivery.
func TestWebhookSupportMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 10)
	require.NoError(t, err)
	var org, wf, run, ep string
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&org))
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO workflows (org_id, name) VALUES ($1, 'wf') RETURNING id`, org).Scan(&wf))
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO validation_runs (org_id, workflow_id, status, submission, finished_at)
		VALUES ($1, $2, 'passed', '{}', now()) RETURNING id`, org, wf).Scan(&run))
	require.NoError(t, db.QueryRowContext(ctx, `INSERT INTO webhook_endpoints (org_id, url, events, secret)
		VALUES ($1, 'https://example.com/h', '["validation_run.finished"]', 'whsec_AAAA') RETURNING id`, org).Scan(&ep))
	_, err = db.ExecContext(ctx, `INSERT INTO webhook_deliveries (org_id, endpoint_id, run_id, event_id) VALUES ($1, $2, $3, 'evt_run')`, org, ep, run)
	require.NoError(t, err)

	_, err = p.UpTo(ctx, 11)
	require.NoError(t, err)
	var resend bool
	require.NoError(t, db.QueryRowContext(ctx, `SELECT resend FROM webhook_deliveries WHERE event_id = 'evt_run'`).Scan(&resend))
	require.False(t, resend)
	_, err = db.ExecContext(ctx, `INSERT INTO webhook_deliveries (org_id, endpoint_id, event_id, event_type) VALUES ($1, $2, 'evt_test', 'webhook.test')`, org, ep)
	require.NoError(t, err, "a test event names no run")
	_, err = db.ExecContext(ctx, `INSERT INTO webhook_deliveries (org_id, endpoint_id, event_id) VALUES ($1, $2, 'evt_none')`, org, ep)
	require.Error(t, err, "a run's event names its run")
	_, err = db.ExecContext(ctx, `INSERT INTO webhook_deliveries (org_id, endpoint_id, run_id, event_id, event_type) VALUES ($1, $2, $3, 'evt_t2', 'webhook.test')`, org, ep, run)
	require.Error(t, err, "a test event names no run")

	_, err = p.DownTo(ctx, 10)
	require.NoError(t, err)
	var events []string
	rows, err := db.QueryContext(ctx, `SELECT event_id FROM webhook_deliveries ORDER BY event_id`)
	require.NoError(t, err)
	for rows.Next() {
		var e string
		require.NoError(t, rows.Scan(&e))
		events = append(events, e)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"evt_run"}, events, "Down drops the test events only")
}
