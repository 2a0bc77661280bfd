package models_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// IsTransient tells the errors of a database that is restarting or out of
// reach (the worker retries them at once, without spending a retry) from
// errors of the statement itself. Each error here is produced for real.
func TestIsTransient(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	ctx := context.Background()

	// A connection the server ends, as it does to every session when it
	// restarts: the session's next statement fails with 57P01.
	victim, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer victim.Close(ctx)
	var ok bool
	require.NoError(t, db.Raw(`SELECT pg_terminate_backend(?)`, victim.PgConn().PID()).Scan(&ok).Error)
	require.True(t, ok)
	var terminated error
	for deadline := time.Now().Add(10 * time.Second); terminated == nil && time.Now().Before(deadline); {
		_, terminated = victim.Exec(ctx, `SELECT 1`)
	}
	require.Error(t, terminated)

	// A server that does not listen: the connection is refused.
	_, refused := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/x?connect_timeout=2", proctest.FreePort(t)))
	require.Error(t, refused)

	statement := func(sql string) error {
		t.Helper()
		err := db.Exec(sql).Error
		require.Error(t, err, sql)
		return err
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"session terminated by the server (57P01)", terminated, true},
		{"connection refused", refused, true},
		{"57P03 raised by the server", statement(`DO $$ BEGIN RAISE EXCEPTION 'starting up' USING ERRCODE = '57P03'; END $$`), true},
		{"wrapped", fmt.Errorf("claim run x: %w", refused), true},
		{"syntax error", statement(`SELEC 1`), false},
		{"unique violation", statement(`INSERT INTO organizations (id, name, slug) VALUES
			('00000000-0000-0000-0000-000000000001', 'a', 'a'), ('00000000-0000-0000-0000-000000000001', 'b', 'b')`), false},
		{"exception raised by a trigger", statement(`DO $$ BEGIN RAISE EXCEPTION 'refused'; END $$`), false},
		{"cancelled", context.Canceled, false},
		{"not found", models.ErrNotFound, false},
		{"other", errors.New("boom"), false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, models.IsTransient(tt.err), "%v", tt.err)
		})
	}
}

// The sweeper finds the runs not final in unfinished_runs: QueuedSince
// pages through the list in id order and returns the queued runs older than
// its bound, each once; a listed run that is final (a statement that ended
// it missed its row) or gone leaves the list; StrandedRunning lists the
// running runs whose lease ran out. Running and recent runs stay listed.
func TestSweeperListsUnfinishedRuns(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	runs := models.NewRunStore(db)
	org, wf := acmeWorkflow(t, db)
	insert := func(status, age string) string {
		t.Helper()
		var id string
		require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, status, submission, created_at, finished_at)
			VALUES (?, ?, ?, '{}', now() - CAST(? AS interval), CASE WHEN ? IN ('passed', 'failed') THEN now() END) RETURNING id`,
			org, wf, status, age, status).Scan(&id).Error)
		require.NoError(t, db.Exec(`INSERT INTO unfinished_runs (id) VALUES (?)`, id).Error)
		return id
	}
	var old []string
	for range 5 {
		old = append(old, insert("queued", "1 hour"))
	}
	recent := insert("queued", "0 seconds")
	running := insert("running", "1 hour")
	ended := insert("passed", "1 hour")
	gone := models.NewRunID()
	require.NoError(t, db.Exec(`INSERT INTO unfinished_runs (id) VALUES (?)`, gone).Error)

	var due []string
	var cursor *models.RunCursor
	for pages := 1; ; pages++ {
		rs, next, err := runs.QueuedSince(ctx, time.Minute, cursor, 3)
		require.NoError(t, err)
		for _, r := range rs {
			require.Equal(t, "queued", r.Status)
			require.Equal(t, org, r.OrgID)
			due = append(due, r.ID)
		}
		if cursor = next; cursor == nil {
			require.Equal(t, 4, pages, "9 listed runs in pages of 3, then an empty one")
			break
		}
	}
	require.ElementsMatch(t, old, due, "each queued run older than the bound, once")

	var listed []string
	require.NoError(t, db.Raw(`SELECT id FROM unfinished_runs`).Scan(&listed).Error)
	require.ElementsMatch(t, append(old, recent, running), listed, "the final run and the gone one left the list")

	stranded, err := runs.StrandedRunning(ctx, 10)
	require.NoError(t, err)
	require.Len(t, stranded, 1)
	require.Equal(t, running, stranded[0].ID)
	require.NotContains(t, listed, ended)
	require.NotContains(t, listed, gone)
}
