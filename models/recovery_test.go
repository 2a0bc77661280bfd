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
