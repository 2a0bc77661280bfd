package models_test

import (
	"context"
	"database/sql"
	"net"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// multiHost is dbURL with hosts in front of its own, as in a
// pg_auto_failover formation's URL: pgx tries them in order and keeps the
// first that takes writes.
func multiHost(t *testing.T, dbURL string, before ...string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	hosts := ""
	for _, h := range before {
		hosts += h + ","
	}
	u.Host = hosts + u.Host
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	return u.String()
}

// A multi-host DATABASE_URL whose first host is down reaches the second:
// the pool writes there, and the migrations (goose on database/sql) see
// the migrated schema through it.
func TestOpenMultiHostURL(t *testing.T) {
	t.Parallel()
	_, dbURL := testdb.New(t, testdb.Options{MaxOpenConns: 2})
	u := multiHost(t, dbURL, closedAddr(t))
	ctx := context.Background()
	db, err := models.Open(ctx, u, models.DBOptions{MaxOpenConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = models.SQLDB(db).Close() })
	o, err := models.NewOrgStore(db).Create(ctx, "multi-host")
	require.NoError(t, err)
	require.NotEmpty(t, o.ID)
	n, err := migrations.Pending(ctx, models.SQLDB(db))
	require.NoError(t, err)
	require.Zero(t, n, "the migrations see the migrated schema through the multi-host URL")
}

// What a failover shows a request, from real PostgreSQL: no host taking
// writes, and a write refused by a server that has become read-only. Each
// is "unavailable" (503 with Retry-After), never a 500.
func TestUnavailableInAFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := models.Open(ctx, multiHost(t, "postgres://postgres@"+closedAddr(t)+"/x?sslmode=disable", closedAddr(t)), models.DBOptions{})
	require.Error(t, err)
	require.True(t, models.IsUnavailable(err), "no host up: %v", err)

	db, _ := testdb.New(t, testdb.Options{MaxOpenConns: 1})
	err = sqlTx(ctx, models.SQLDB(db), `SET TRANSACTION READ ONLY`, `CREATE TABLE refused (id int)`)
	require.ErrorContains(t, err, "read-only transaction")
	require.True(t, models.IsUnavailable(err), "a write refused as read-only (25006): %v", err)
}

// sqlTx runs stmts in one transaction, rolled back, and returns the first error.
func sqlTx(ctx context.Context, db *sql.DB, stmts ...string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	for _, s := range stmts {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	return nil
}
