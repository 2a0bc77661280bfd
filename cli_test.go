package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

// The CLI reads its configuration from the process environment (t.Setenv),
// so none of these tests can run in parallel.

// unreachableDB is a DATABASE_URL nothing listens on.
const unreachableDB = "postgres://postgres:s3cret@127.0.0.1:1/valruns?sslmode=disable"

// setEnv resets every configuration variable to its default for the test
// and points DATABASE_URL at dbURL.
func setEnv(t *testing.T, dbURL string) {
	t.Helper()
	for _, v := range config.Vars {
		t.Setenv(v.Name, "")
	}
	t.Setenv("DATABASE_URL", dbURL)
	t.Setenv("LOG_LEVEL", "error") // keep the test output readable
}

// result is what one run of the CLI produced.
type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	return runCtx(t, context.Background(), args...)
}

func runCtx(t *testing.T, ctx context.Context, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(ctx, args, &out, &errOut)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// migratedDB is a fresh migrated database with the environment pointing at it.
func migratedDB(t *testing.T) *gorm.DB {
	t.Helper()
	db, u := testdb.New(t)
	setEnv(t, u)
	return db
}

// emptyDB is a fresh unmigrated database with the environment pointing at it.
func emptyDB(t *testing.T) *gorm.DB {
	t.Helper()
	db, u := testdb.New(t, testdb.Options{Empty: true})
	setEnv(t, u)
	return db
}

func TestUsage(t *testing.T) {
	setEnv(t, unreachableDB) // usage and --help never touch the database
	tests := []struct {
		name     string
		args     []string
		wantCode int
		// wantOut must appear on stdout, wantErr on stderr.
		wantOut, wantErr string
	}{
		{name: "no args", args: nil, wantCode: 2, wantOut: "Usage:"},
		{name: "help", args: []string{"help"}, wantCode: 0, wantOut: "Usage:"},
		{name: "-h", args: []string{"-h"}, wantCode: 0, wantOut: "Usage:"},
		{name: "--help", args: []string{"--help"}, wantCode: 0, wantOut: "Usage:"},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2, wantErr: `unknown command "frobnicate"`},
		{name: "serve --help", args: []string{"serve", "--help"}, wantCode: 0, wantOut: "Usage: valruns serve"},
		{name: "serve --worker --help", args: []string{"serve", "--worker", "--help"}, wantCode: 0, wantOut: "Usage: valruns serve"},
		{name: "worker --help", args: []string{"worker", "--help"}, wantCode: 0, wantOut: "Usage: valruns worker"},
		{name: "migrate --help", args: []string{"migrate", "--help"}, wantCode: 0, wantOut: "Usage: valruns migrate"},
		{name: "cleanup --help", args: []string{"cleanup", "--help"}, wantCode: 0, wantOut: "Usage: valruns cleanup"},
		{name: "org --help", args: []string{"org", "--help"}, wantCode: 0, wantOut: "Usage: valruns org"},
		{name: "token --help", args: []string{"token", "--help"}, wantCode: 0, wantOut: "Usage: valruns token create"},
		{name: "token create --help", args: []string{"token", "create", "--help"}, wantCode: 0, wantOut: "Usage: valruns token create"},
		{name: "demo --help", args: []string{"demo", "--help"}, wantCode: 0, wantOut: "Usage: valruns demo"},
		{name: "unknown flag", args: []string{"serve", "--bogus"}, wantCode: 1, wantErr: "bogus"},
		{name: "migrate without action", args: []string{"migrate"}, wantCode: 1, wantErr: "want one of up, down, status"},
		{name: "org without create", args: []string{"org", "Acme"}, wantCode: 1, wantErr: "org create NAME"},
		{name: "token without create", args: []string{"token"}, wantCode: 1, wantErr: "token create --org SLUG"},
		{name: "token create without --org", args: []string{"token", "create"}, wantCode: 1, wantErr: "--org SLUG is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(t, tt.args...)
			require.Equal(t, tt.wantCode, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			require.Contains(t, r.stdout, tt.wantOut)
			require.Contains(t, r.stderr, tt.wantErr)
			if tt.wantCode == 0 {
				require.Empty(t, r.stderr)
			}
			require.NotContains(t, r.stderr, "DATABASE_URL", "help and usage must not connect")
		})
	}
}

func TestMigrateUpStatusDown(t *testing.T) {
	emptyDB(t)
	// The newest migration: `migrate down` rolls back that one.
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	newest := files[len(files)-1]
	version, err := strconv.Atoi(strings.SplitN(newest, "_", 2)[0])
	require.NoError(t, err)
	atVersion := fmt.Sprintf("database at version %d", version)

	r := runCLI(t, "migrate", "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `0001_init\.sql\s+pending`, r.stdout)

	r = runCLI(t, "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "applied 0001_init.sql")
	require.Contains(t, r.stdout, "applied "+newest)
	require.Contains(t, r.stdout, atVersion)

	r = runCLI(t, "migrate", "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `0001_init\.sql\s+applied \d{4}-\d\d-\d\dT`, r.stdout)
	require.NotContains(t, r.stdout, "pending")

	r = runCLI(t, "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	require.NotContains(t, r.stdout, "applied 0001", "up twice applies nothing the second time")
	require.Contains(t, r.stdout, atVersion)

	r = runCLI(t, "migrate", "down")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "rolled back "+newest)

	r = runCLI(t, "migrate", "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, regexp.QuoteMeta(newest)+`\s+pending`, r.stdout)

	r = runCLI(t, "migrate", "sideways")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `unknown migrate action "sideways"`)
}

func TestRefusesUnmigratedDatabase(t *testing.T) {
	tests := [][]string{
		{"serve"},
		{"worker"},
		{"org", "create", "Acme"},
		{"token", "create", "--org", "acme"},
		{"cleanup"},
		{"demo", "--token-file", filepath.Join(t.TempDir(), "token")},
	}
	for _, args := range tests {
		t.Run(args[0], func(t *testing.T) {
			db := emptyDB(t)
			t.Setenv("HTTP_ADDR", "127.0.0.1:0")
			r := runCLI(t, args...)
			require.Equal(t, 1, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			require.Contains(t, r.stderr, "valruns migrate up")
			require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
			var n int
			require.NoError(t, db.Raw(`SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public' AND table_name = 'organizations'`).Scan(&n).Error)
			require.Zero(t, n, "nothing was migrated")
		})
	}
}

func TestOrgAndTokenCreate(t *testing.T) {
	db := migratedDB(t)

	r := runCLI(t, "org", "create", "Acme Inc")
	require.Equal(t, 0, r.code, r.stderr)
	m := regexp.MustCompile(`^slug=(\S+) id=(\S+)\n$`).FindStringSubmatch(r.stdout)
	require.NotNil(t, m, "output %q", r.stdout)
	require.Equal(t, "acme-inc", m[1])
	require.NoError(t, uuid.Validate(m[2]), "id %q", m[2])
	orgID := m[2]

	r = runCLI(t, "org", "create", "Acme Inc")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "slug=acme-inc-2 ", "a taken slug gets a suffix")

	r = runCLI(t, "token", "create", "--org", "acme-inc")
	require.Equal(t, 0, r.code, r.stderr)
	token := strings.TrimSuffix(r.stdout, "\n")
	require.NotContains(t, token, "\n", "only the token is printed")
	require.True(t, strings.HasPrefix(token, "vr_"), "token %q", token)
	require.Greater(t, len(token), 20)

	sum := sha256.Sum256([]byte(token))
	var n int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM api_tokens WHERE token_hash = ? AND org_id = ? AND revoked_at IS NULL`, sum[:], orgID).Scan(&n).Error)
	require.EqualValues(t, 1, n, "the token's SHA-256 is stored for the organisation")
	for _, table := range []string{"api_tokens", "organizations", "audit_records"} {
		require.NoError(t, db.Raw(`SELECT count(*) FROM `+table+` t WHERE strpos(t::text, ?) > 0`, token).Scan(&n).Error)
		require.Zero(t, n, "the token in clear is stored in %s", table)
	}

	p, err := models.NewTokenStore(db).Authenticate(context.Background(), token)
	require.NoError(t, err, "the printed token authenticates")
	require.Equal(t, orgID, p.OrgID)

	r2 := runCLI(t, "token", "create", "--org", "acme-inc")
	require.Equal(t, 0, r2.code, r2.stderr)
	require.NotEqual(t, token, strings.TrimSpace(r2.stdout), "every token is new")

	r = runCLI(t, "token", "create", "--org", "nope")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, `no organisation with slug "nope"`)
	require.Contains(t, r.stderr, "valruns org create")

	r = runCLI(t, "org", "create", "  ")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "name must be 1 to 200 characters")
}

func TestStartupErrorsNameTheVariable(t *testing.T) {
	tests := []struct {
		name     string
		dbURL    string
		env      map[string]string
		args     []string
		wantVar  string
		wantGone string // must not appear in stderr
	}{
		{name: "unreachable database", dbURL: unreachableDB, args: []string{"org", "create", "Acme"}, wantVar: "DATABASE_URL", wantGone: "s3cret"},
		{name: "unreachable database, serve", dbURL: unreachableDB, args: []string{"serve"}, wantVar: "DATABASE_URL", wantGone: "s3cret"},
		{name: "unreachable database, migrate", dbURL: unreachableDB, args: []string{"migrate", "up"}, wantVar: "DATABASE_URL", wantGone: "s3cret"},
		{name: "bad IDEMPOTENCY_TTL", env: map[string]string{"IDEMPOTENCY_TTL": "abc"}, args: []string{"serve"}, wantVar: "IDEMPOTENCY_TTL"},
		{name: "bad LOG_LEVEL", env: map[string]string{"LOG_LEVEL": "loud"}, args: []string{"migrate", "status"}, wantVar: "LOG_LEVEL"},
		{name: "bad MAX_BODY_BYTES", env: map[string]string{"MAX_BODY_BYTES": "0"}, args: []string{"cleanup"}, wantVar: "MAX_BODY_BYTES"},
		{name: "bad DATABASE_URL scheme", dbURL: "mysql://root@127.0.0.1/x", args: []string{"serve"}, wantVar: "DATABASE_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, cmp.Or(tt.dbURL, unreachableDB))
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			r := runCLI(t, tt.args...)
			require.Equal(t, 1, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			require.Contains(t, r.stderr, tt.wantVar)
			require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
			if tt.wantGone != "" {
				require.NotContains(t, r.stderr, tt.wantGone, "the password is redacted")
			}
		})
	}
}

func TestServeHTTPAddrInUse(t *testing.T) {
	migratedDB(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	t.Setenv("HTTP_ADDR", ln.Addr().String())
	r := runCLI(t, "serve")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "HTTP_ADDR")
}

func TestDemoIsRepeatable(t *testing.T) {
	db := migratedDB(t)
	tokenFile := filepath.Join(t.TempDir(), "sub", "demo-token")

	parse := func(out string) map[string]string {
		t.Helper()
		vars := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "line %q", line)
			vars[k] = v
		}
		require.Len(t, vars, 3, "output %q", out)
		return vars
	}

	r := runCLI(t, "demo", "--token-file", tokenFile)
	require.Equal(t, 0, r.code, r.stderr)
	first := parse(r.stdout)
	require.Equal(t, "demo", first["DEMO_ORG"])
	require.True(t, strings.HasPrefix(first["DEMO_TOKEN"], "vr_"))
	require.NoError(t, uuid.Validate(first["DEMO_WORKFLOW"]))
	b, err := os.ReadFile(tokenFile)
	require.NoError(t, err)
	require.Equal(t, first["DEMO_TOKEN"], strings.TrimSpace(string(b)))

	r = runCLI(t, "demo", "--token-file", tokenFile)
	require.Equal(t, 0, r.code, r.stderr)
	second := parse(r.stdout)
	require.Equal(t, first, second, "the second run reuses the org, token and workflow")

	var orgs, tokens, workflows int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM organizations`).Scan(&orgs).Error)
	require.NoError(t, db.Raw(`SELECT count(*) FROM api_tokens`).Scan(&tokens).Error)
	require.NoError(t, db.Raw(`SELECT count(*) FROM workflows`).Scan(&workflows).Error)
	require.Equal(t, [3]int64{1, 1, 1}, [3]int64{orgs, tokens, workflows})

	// A token file that no longer matches the database gets a new token.
	require.NoError(t, os.WriteFile(tokenFile, []byte("vr_stale\n"), 0o600))
	r = runCLI(t, "demo", "--token-file", tokenFile)
	require.Equal(t, 0, r.code, r.stderr)
	third := parse(r.stdout)
	require.NotEqual(t, "vr_stale", third["DEMO_TOKEN"])
	require.Equal(t, first["DEMO_WORKFLOW"], third["DEMO_WORKFLOW"])
}

func TestCleanup(t *testing.T) {
	db := migratedDB(t)
	var orgID string
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&orgID).Error)
	insert := func(key, created, expires string) {
		t.Helper()
		require.NoError(t, db.Exec(`INSERT INTO idempotency_keys
			(org_id, endpoint, key, request_hash, request_method, request_path, response_status,
			 response_body, request_id, created_at, expires_at)
			VALUES (?, 'workflow_start', ?, sha256('x'::bytea), 'POST', '/p', 201, '\x7b7d', 'req',
			        now() + CAST(? AS interval), now() + CAST(? AS interval))`, orgID, key, created, expires).Error)
	}
	insert("old-1", "-2 days", "-1 day")
	insert("old-2", "-3 days", "-2 days")
	insert("live", "-1 hour", "23 hours")

	r := runCLI(t, "cleanup", "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "2 expired idempotency keys would be deleted\n", r.stdout)
	var n int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM idempotency_keys`).Scan(&n).Error)
	require.EqualValues(t, 3, n, "a dry run deletes nothing")

	t.Setenv("CLEANUP_BATCH_SIZE", "1") // several batches
	r = runCLI(t, "cleanup")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "deleted 2 expired idempotency keys\n", r.stdout)
	var left []string
	require.NoError(t, db.Raw(`SELECT key FROM idempotency_keys`).Scan(&left).Error)
	require.Equal(t, []string{"live"}, left)

	r = runCLI(t, "cleanup", "--dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "0 expired idempotency keys would be deleted\n", r.stdout)
}

func TestServeGracefulShutdown(t *testing.T) {
	emptyDB(t)
	addr := proctest.FreeAddr(t)
	t.Setenv("HTTP_ADDR", addr)
	t.Setenv("MIGRATE_ON_START", "true")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan result, 1)
	go func() {
		var out, errOut bytes.Buffer
		code := run(ctx, []string{"serve"}, &out, &errOut)
		done <- result{code: code, stdout: out.String(), stderr: errOut.String()}
	}()

	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) (int, error) {
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	apitest.Eventually(t, 30*time.Second, func() bool {
		select {
		case r := <-done:
			t.Fatalf("serve exited early with %d: %s", r.code, r.stderr)
		default:
		}
		_, err := get("/healthz")
		return err == nil
	}, "serve never answered /healthz")

	for _, path := range []string{"/healthz", "/readyz", "/healthz/", "/readyz/"} {
		code, err := get(path)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, path)
	}
	code, err := get("/api/workflows/")
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code, "the migrated-on-start API answers")

	cancel()
	select {
	case r := <-done:
		require.Equal(t, 0, r.code, "serve after cancel: stderr %q", r.stderr)
		require.Empty(t, r.stderr)
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not return after its context was cancelled")
	}
	_, err = get("/healthz")
	require.Error(t, err, "the listener is closed after shutdown")
}
