package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

// contractTables is every table CONTRACT.md's schema names.
var contractTables = []string{
	"api_tokens",
	"audit_records",
	"findings",
	"idempotency_keys",
	"organizations",
	"staged_jobs",
	"usage_counters",
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
		WHERE table_schema = 'public' AND table_type = 'BASE TABLE' AND table_name = ANY($1)
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

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	p, err := migrations.NewProvider(db)
	require.NoError(t, err)

	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	n := len(files) // sorted: the last is the newest
	last, err := strconv.Atoi(strings.SplitN(files[n-1], "_", 2)[0])
	require.NoError(t, err)
	require.Equal(t, n, pending(t, db), "an empty database has every migration pending")
	require.Empty(t, tables(t, db))

	for round := 1; round <= 2; round++ {
		res, err := p.Up(ctx)
		require.NoError(t, err, "up, round %d", round)
		require.Len(t, res, n, "round %d", round)
		require.Equal(t, "0001_init.sql", res[0].Source.Path)
		for _, r := range res {
			require.NoError(t, r.Error, r.Source.Path)
		}
		v, err := p.GetDBVersion(ctx)
		require.NoError(t, err)
		require.EqualValues(t, last, v)
		require.Equal(t, 0, pending(t, db), "round %d", round)
		if d := cmp.Diff(contractTables, tables(t, db)); d != "" {
			t.Fatalf("round %d: tables after up (-want +got):\n%s", round, d)
		}

		// Up again is a no-op.
		res, err = p.Up(ctx)
		require.NoError(t, err)
		require.Empty(t, res)

		unique := indexDef(t, db, "idempotency_keys", "UNIQUE INDEX", "(org_id, endpoint, key)")
		require.NotEmpty(t, unique, "round %d: unique index on idempotency_keys (org_id, endpoint, key)", round)
		expires := indexDef(t, db, "idempotency_keys", "(expires_at)")
		require.NotEmpty(t, expires, "round %d: index on idempotency_keys (expires_at)", round)

		down, err := p.DownTo(ctx, 0)
		require.NoError(t, err, "down, round %d", round)
		require.Len(t, down, n)
		require.Empty(t, tables(t, db), "round %d: tables left after DownTo(0)", round)
		require.Empty(t, indexDef(t, db, "idempotency_keys", "(expires_at)"))
		require.Equal(t, n, pending(t, db), "round %d: every migration pending again after DownTo(0)", round)
	}
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
		{name: "same org, endpoint and key", sql: insertKey, args: []any{orgID, "workflow_start", strings.Repeat("k", 255)}, wantCode: "23505"},
		{name: "same key, other endpoint", sql: insertKey, args: []any{orgID, "workflow_create", strings.Repeat("k", 255)}},
		{name: "queued run", sql: insertRun, args: []any{orgID, wfID, "queued", "{}", nil, nil}},
		{name: "unknown status", sql: insertRun, args: []any{orgID, wfID, "done", "{}", nil, nil}, wantCode: "23514"},
		{name: "passed without finished_at", sql: insertRun, args: []any{orgID, wfID, "passed", "{}", nil, nil}, wantCode: "23514"},
		{name: "error without error text", sql: insertRun, args: []any{orgID, wfID, "error", "{}", "2026-01-01T00:00:00Z", nil}, wantCode: "23514"},
		{name: "metadata not an object", sql: insertRun, args: []any{orgID, wfID, "queued", "[1]", nil, nil}, wantCode: "23514"},
		{name: "run of an unknown workflow", sql: insertRun, args: []any{orgID, "00000000-0000-0000-0000-000000000000", "queued", "{}", nil, nil}, wantCode: "23503"},
		{name: "bad slug", sql: `INSERT INTO organizations (name, slug) VALUES ('x', 'Not A Slug')`, wantCode: "23514"},
		{name: "token hash not 32 bytes", sql: `INSERT INTO api_tokens (org_id, token_hash, display) VALUES ($1, '\x00', 'vr_x')`, args: []any{orgID}, wantCode: "23514"},
		{name: "usage period not the first of a month", sql: `INSERT INTO usage_counters (org_id, period) VALUES ($1, '2026-01-02')`, args: []any{orgID}, wantCode: "23514"},
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
