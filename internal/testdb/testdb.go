// Package testdb gives tests real PostgreSQL databases: each call to New
// returns a fresh database cloned from a migrated template, dropped when the
// test ends, so tests that commit (concurrency, crashes, several processes)
// never see each other's rows.
package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"gorm.io/gorm"

	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

// DefaultURL is used when TEST_DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/valruns_test?sslmode=disable"

// BaseURL is TEST_DATABASE_URL or DefaultURL.
func BaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Options tunes New.
type Options struct {
	// Tracer sees every statement of the returned pool.
	Tracer pgx.QueryTracer
	// MaxOpenConns of the returned pool; 0 means models.Open's default.
	MaxOpenConns int
	// StatementTimeout is PostgreSQL's statement_timeout on the pool's connections.
	StatementTimeout time.Duration
	// Empty: no migrations applied (for migration tests).
	Empty bool
}

// PastKeyDays is how many days back a test database has partitions of
// idempotency keys: a test's expired key (expires_at in the past) needs
// the partition of its day, as no cleanup has dropped it yet.
const PastKeyDays = 3

// New creates a fresh database (migrated unless opt.Empty), opens a pool on
// it and drops both at the end of the test. It returns the pool and the
// database's URL (for child processes).
func New(t testing.TB, opt ...Options) (*gorm.DB, string) {
	t.Helper()
	var o Options
	if len(opt) > 0 {
		o = opt[0]
	}
	ctx := context.Background()
	admin := adminDB(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "valruns_t_" + hex.EncodeToString(b[:])
	template := "template0"
	if !o.Empty {
		template = ensureTemplate(t, admin)
	}
	withLock(t, admin, func(conn *sql.Conn) {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, name, template)); err != nil {
			t.Fatalf("testdb: create database: %v", err)
		}
	})
	u := withDBName(t, BaseURL(), name)
	// TEST_DATABASE_POOLER_URL, when set, is a pooler in transaction mode
	// (PgBouncer) in front of TEST_DATABASE_URL's server: the pool goes
	// through it (DATABASE_POOLER=transaction), the returned URL does not.
	poolURL, pooler := u, os.Getenv("TEST_DATABASE_POOLER_URL")
	if pooler != "" {
		poolURL = withDBName(t, pooler, name)
	}
	// models.Open gives the first connection 5 s, as a server at start-up
	// does; the first connection to a database just cloned can take longer
	// on a machine whose cores are all busy (make test-under-load saw it),
	// so the tests give it four tries before they fail.
	var db *gorm.DB
	var err error
	for try := 1; ; try++ {
		db, err = models.Open(ctx, poolURL, models.DBOptions{Tracer: o.Tracer, MaxOpenConns: o.MaxOpenConns,
			StatementTimeout: o.StatementTimeout, TransactionPooler: pooler != ""})
		if err == nil || try == 4 {
			break
		}
		t.Logf("testdb: open %s, try %d: %v", name, try, err)
		time.Sleep(time.Second)
	}
	if err != nil {
		t.Fatalf("testdb: open %s: %v", name, err)
	}
	if !o.Empty {
		// The template may be days old: the idempotency keys' partitions
		// (migration 0012) from PastKeyDays ago, for the tests' expired
		// keys, through the longest IDEMPOTENCY_TTL and its margin ahead.
		if err := db.Exec(`SELECT idempotency_key_partitions(now() - CAST(? AS integer) * interval '1 day', now() + interval '10 days')`,
			PastKeyDays).Error; err != nil {
			t.Fatalf("testdb: key partitions of %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		_ = models.SQLDB(db).Close()
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(dctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name)); err != nil {
			t.Logf("testdb: drop %s: %v", name, err)
		}
	})
	return db, u
}

// adminDB connects to the server's maintenance database.
func adminDB(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", withDBName(t, BaseURL(), "postgres"))
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("testdb: PostgreSQL at %s does not answer (run `make services`): %v", BaseURL(), err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// withLock serialises template builds and clones across test packages,
// which go test runs in parallel.
func withLock(t testing.TB, admin *sql.DB, fn func(*sql.Conn)) {
	t.Helper()
	ctx := context.Background()
	conn, err := admin.Conn(ctx)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(7261536001)`); err != nil {
		t.Fatalf("testdb: lock: %v", err)
	}
	defer func() { _, _ = conn.ExecContext(ctx, `SELECT pg_advisory_unlock(7261536001)`) }()
	fn(conn)
}

// ensureTemplate builds, once per migration set, a migrated template database.
func ensureTemplate(t testing.TB, admin *sql.DB) string {
	t.Helper()
	name := "valruns_tmpl_" + migrationsHash(t)
	ctx := context.Background()
	withLock(t, admin, func(conn *sql.Conn) {
		var exists bool
		if err := conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
			t.Fatalf("testdb: %v", err)
		}
		if exists {
			return
		}
		building := name + "_building"
		_, _ = conn.ExecContext(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, building))
		if _, err := conn.ExecContext(ctx, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE template0`, building)); err != nil {
			t.Fatalf("testdb: create template: %v", err)
		}
		db, err := sql.Open("pgx", withDBName(t, BaseURL(), building))
		if err != nil {
			t.Fatalf("testdb: %v", err)
		}
		p, err := migrations.NewProvider(db)
		if err == nil {
			_, err = p.Up(ctx)
		}
		_ = db.Close()
		if err != nil {
			t.Fatalf("testdb: migrate template: %v", err)
		}
		// Renamed only once complete: a crash mid-build never leaves a half template.
		if _, err := conn.ExecContext(ctx, fmt.Sprintf(`ALTER DATABASE %s RENAME TO %s`, building, name)); err != nil {
			t.Fatalf("testdb: rename template: %v", err)
		}
	})
	return name
}

func migrationsHash(t testing.TB) string {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		h.Write([]byte(path))
		h.Write(b)
		return err
	})
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func withDBName(t testing.TB, raw, name string) string {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("testdb: TEST_DATABASE_URL: %v", err)
	}
	u.Path = "/" + strings.TrimPrefix(name, "/")
	return u.String()
}

// Refuse makes PostgreSQL refuse every connection to db's database and
// ends the ones open, so that its clients find it unreachable, until the
// returned function (called at cleanup too) lets them connect again.
func Refuse(t testing.TB, db *gorm.DB) (allow func()) {
	t.Helper()
	var name string
	if err := db.Raw(`SELECT current_database()`).Scan(&name).Error; err != nil {
		t.Fatalf("testdb: %v", err)
	}
	admin := adminDB(t)
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, fmt.Sprintf(`ALTER DATABASE %q WITH ALLOW_CONNECTIONS false`, name)); err != nil {
		t.Fatalf("testdb: refuse connections: %v", err)
	}
	if _, err := admin.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name); err != nil {
		t.Fatalf("testdb: end connections: %v", err)
	}
	var once sync.Once
	allow = func() {
		once.Do(func() {
			if _, err := admin.ExecContext(ctx, fmt.Sprintf(`ALTER DATABASE %q WITH ALLOW_CONNECTIONS true`, name)); err != nil {
				t.Errorf("testdb: allow connections: %v", err)
			}
		})
	}
	t.Cleanup(allow)
	return allow
}
