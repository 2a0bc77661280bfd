package cli

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

// The CLI reads its configuration from the process environment (t.Setenv),
// so none of these tests can run in parallel.

// unreachableDB is a DATABASE_URL nothing listens on.
const unreachableDB = "postgres://postgres:s3cret@127.0.0.1:1/valruns?sslmode=disable"

// setEnv resets every configuration variable to its default for the test,
// points DATABASE_URL at dbURL and REDIS_URL at the tests' Redis
// (TEST_REDIS_URL): REDIS_URL's default is the database `make run` uses.
func setEnv(t *testing.T, dbURL string) {
	t.Helper()
	for _, v := range config.Vars {
		t.Setenv(v.Name, "")
	}
	t.Setenv("DATABASE_URL", dbURL)
	t.Setenv("REDIS_URL", proctest.RedisURL())
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
	code := Run(ctx, args, &out, &errOut)
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

// cmdPath is a command of the table with the words that reach it.
type cmdPath struct {
	path []string
	cmd  command
}

func (c cmdPath) name() string { return strings.Join(c.path, " ") }

// walkCommands returns every group and every runnable command of the
// table Run dispatches on, so no command escapes the tests below.
func walkCommands() (groups, leaves []cmdPath) {
	var walk func(path []string, cmds []command)
	walk = func(path []string, cmds []command) {
		for _, c := range cmds {
			p := append(slices.Clone(path), c.name)
			if c.subs != nil {
				groups = append(groups, cmdPath{p, c})
				walk(p, c.subs)
				continue
			}
			leaves = append(leaves, cmdPath{p, c})
		}
	}
	walk(nil, commands)
	return groups, leaves
}

// dbState is what any acting command would change.
type dbState struct {
	Orgs, Tokens, Revoked, Workflows, Migrations int64
	Quota                                        *int64
}

func snapshot(t *testing.T, db *gorm.DB) dbState {
	t.Helper()
	var s dbState
	require.NoError(t, db.Raw(`SELECT
		(SELECT count(*) FROM organizations) AS orgs,
		(SELECT count(*) FROM api_tokens) AS tokens,
		(SELECT count(*) FROM api_tokens WHERE revoked_at IS NOT NULL) AS revoked,
		(SELECT count(*) FROM workflows) AS workflows,
		(SELECT count(*) FROM goose_db_version) AS migrations,
		(SELECT monthly_run_quota FROM organizations WHERE slug = 'acme') AS quota`).Scan(&s).Error)
	return s
}

// TestHelpWalk asks every command and group of the table for help, in every
// spelling and after otherwise valid arguments: each prints its usage on
// stdout, exits 0, needs no database, and changes nothing.
func TestHelpWalk(t *testing.T) {
	db := migratedDB(t)
	ctx := context.Background()
	org, err := models.NewOrgStore(db).Create(ctx, "Acme")
	require.NoError(t, err)
	_, tok, err := models.NewTokenStore(db).Create(ctx, org.ID)
	require.NoError(t, err)
	dbURL := os.Getenv("DATABASE_URL")
	before := snapshot(t, db)

	// Valid arguments for commands that take some: with them and without
	// --help, each of these would act.
	valid := map[string][]string{
		"org create":   {"Acme Two", "--slug", "acme-two"},
		"org quota":    {"acme", "5"},
		"token create": {"--org", "acme"},
		"token list":   {"--org", "acme"},
		"token revoke": {tok.ID},
		"demo":         {"--token-file", filepath.Join(t.TempDir(), "token")},
	}
	groups, leaves := walkCommands()
	require.NotEmpty(t, leaves)
	for _, database := range []string{"migrated", "unreachable"} {
		t.Run(database, func(t *testing.T) {
			url := dbURL
			if database == "unreachable" {
				url = unreachableDB
			}
			t.Setenv("DATABASE_URL", url)
			for _, g := range groups {
				want := "Usage: valruns " + g.name() + " SUBCOMMAND\n"
				for _, args := range [][]string{
					append(slices.Clone(g.path), "-h"),
					append(slices.Clone(g.path), "--help"),
					append(slices.Clone(g.path), "help"),
					append([]string{"help"}, g.path...),
				} {
					r := runCLI(t, args...)
					require.Equal(t, 0, r.code, "%q: stderr %s", args, r.stderr)
					require.Empty(t, r.stderr, "%q", args)
					require.True(t, strings.HasPrefix(r.stdout, want), "%q: stdout %q", args, r.stdout)
					for _, sub := range g.cmd.subs {
						require.Contains(t, r.stdout, "valruns "+synopsis(append(slices.Clone(g.path), sub.name), sub), "%q", args)
					}
				}
			}
			for _, l := range leaves {
				want := "Usage: valruns " + synopsis(l.path, l.cmd) + "\n"
				ex := valid[l.name()]
				for _, args := range [][]string{
					append(slices.Clone(l.path), "-h"),
					append(slices.Clone(l.path), "--help"),
					append(slices.Clone(l.path), "-help"),
					append(append(slices.Clone(l.path), ex...), "--help"),
					append(append(slices.Clone(l.path), "-h"), ex...),
					append([]string{"help"}, l.path...),
				} {
					r := runCLI(t, args...)
					require.Equal(t, 0, r.code, "%q: stderr %s", args, r.stderr)
					require.Empty(t, r.stderr, "%q", args)
					require.True(t, strings.HasPrefix(r.stdout, want), "%q: stdout %q, want it to start with %q", args, r.stdout, want)
				}
			}
			require.Equal(t, before, snapshot(t, db), "a --help acted")
		})
	}

	// The case: `org create --help` used to create an organisation named --help.
	r := runCLI(t, "org", "create", "--help")
	require.Equal(t, 0, r.code)
	require.Equal(t, before, snapshot(t, db))
	// After "--" every word is an operand, so a name that starts with - can still be given.
	r = runCLI(t, "org", "create", "--slug", "dash-help", "--", "--help")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "slug=dash-help ")
}

// TestHelpSaysWhatItDoes: every command's --help has a paragraph after its
// usage line saying what the command does, before any list of flags.
func TestHelpSaysWhatItDoes(t *testing.T) {
	setEnv(t, unreachableDB)
	_, leaves := walkCommands()
	for _, l := range leaves {
		r := runCLI(t, append(slices.Clone(l.path), "--help")...)
		require.Equal(t, 0, r.code, r.stderr)
		_, rest, _ := strings.Cut(r.stdout, "\n")
		doc, _, _ := strings.Cut(strings.TrimPrefix(rest, "\n"), "\n\n")
		require.True(t, strings.HasPrefix(rest, "\n") && len(doc) > 20 && !strings.HasPrefix(doc, "Flags:"),
			"valruns %s --help says what it does after its usage line:\n%s", l.name(), r.stdout)
	}
}

// TestBadUsage: every bad call exits 2 with one line on stderr, why and
// where the usage is ("; see valruns CMD --help"), before any connection to
// the database; the usage itself only with --help.
func TestBadUsage(t *testing.T) {
	setEnv(t, unreachableDB)
	tests := []struct {
		args []string
		// wantErr starts the one line on stderr; wantHelp ends it.
		wantErr, wantHelp string
	}{
		{args: []string{"frobnicate"}, wantErr: `valruns: unknown command "frobnicate"`, wantHelp: "; see valruns --help"},
		{args: []string{"token"}, wantErr: "valruns token: missing subcommand", wantHelp: "; see valruns token --help"},
		{args: []string{"token", "--org", "acme"}, wantErr: "valruns token: missing subcommand", wantHelp: "; see valruns token --help"},
		{args: []string{"token", "make"}, wantErr: `valruns token: unknown subcommand "make"`, wantHelp: "; see valruns token --help"},
		{args: []string{"org"}, wantErr: "valruns org: missing subcommand", wantHelp: "; see valruns org --help"},
		{args: []string{"org", "Acme"}, wantErr: `valruns org: unknown subcommand "Acme"`, wantHelp: "; see valruns org --help"},
		{args: []string{"migrate"}, wantErr: "valruns migrate: missing subcommand", wantHelp: "; see valruns migrate --help"},
		{args: []string{"migrate", "sideways"}, wantErr: `valruns migrate: unknown subcommand "sideways"`, wantHelp: "; see valruns migrate --help"},
		{args: []string{"migrate", "up", "now"}, wantErr: `valruns migrate up: unexpected argument "now"`, wantHelp: "; see valruns migrate up --help"},
		{args: []string{"serve", "now"}, wantErr: `valruns serve: unexpected argument "now"`, wantHelp: "; see valruns serve --help"},
		{args: []string{"org", "create"}, wantErr: "valruns org create: missing NAME", wantHelp: "; see valruns org create --help"},
		{args: []string{"org", "create", "Acme", "Corp"}, wantErr: "valruns org create: want one NAME, got 2 words", wantHelp: "; see valruns org create --help"},
		{args: []string{"org", "create", "  "}, wantErr: "valruns org create: NAME: name must be 1 to 200 characters", wantHelp: "; see valruns org create --help"},
		{args: []string{"org", "create", strings.Repeat("x", 201)}, wantErr: "valruns org create: NAME: name must be 1 to 200 characters", wantHelp: "; see valruns org create --help"},
		{args: []string{"org", "create", "Acme", "--slug", "Not A Slug"}, wantErr: `valruns org create: --slug: slug "Not A Slug": a slug is 1 to 63 lowercase`, wantHelp: "; see valruns org create --help"},
		{args: []string{"org", "create", "Acme", "--slug"}, wantErr: "valruns org create: flag needs an argument: -slug", wantHelp: "; see valruns org create --help"},
		{args: []string{"org", "list", "all"}, wantErr: `valruns org list: unexpected argument "all"`, wantHelp: "; see valruns org list --help"},
		{args: []string{"org", "quota", "acme"}, wantErr: "valruns org quota: want SLUG and N|default, got 1 argument(s)", wantHelp: "; see valruns org quota --help"},
		{args: []string{"org", "quota", "acme", "lots"}, wantErr: `valruns org quota: quota "lots": want a whole number >= 0 (0: unlimited) or default`, wantHelp: "; see valruns org quota --help"},
		{args: []string{"org", "quota", "acme", "1.5"}, wantErr: `valruns org quota: quota "1.5": want a whole number`, wantHelp: "; see valruns org quota --help"},
		{args: []string{"org", "quota", "acme", "-5"}, wantErr: `valruns org quota: quota "-5": want a whole number >= 0 (0: unlimited) or default`, wantHelp: "; see valruns org quota --help"},
		{args: []string{"org", "quota", "-5", "acme"}, wantErr: `valruns org quota: quota "acme": want a whole number >= 0`, wantHelp: "; see valruns org quota --help"},
		{args: []string{"org", "quota", "acme", "--", "-5"}, wantErr: `valruns org quota: quota "-5": want a whole number >= 0`, wantHelp: "; see valruns org quota --help"},
		{args: []string{"org", "create", "Acme", "--slug", ""}, wantErr: "valruns org create: --slug is empty (an unset variable?): give it a value, or leave the flag out", wantHelp: "; see valruns org create --help"},
		{args: []string{"token", "list", "--org="}, wantErr: "valruns token list: --org is empty", wantHelp: "; see valruns token list --help"},
		{args: []string{"org", "quota", "acme", "99999999999999999999"}, wantErr: `valruns org quota: quota "99999999999999999999": want a whole number`, wantHelp: "; see valruns org quota --help"},
		{args: []string{"token", "create"}, wantErr: "valruns token create: --org SLUG is required", wantHelp: "; see valruns token create --help"},
		{args: []string{"token", "list"}, wantErr: "valruns token list: --org SLUG is required", wantHelp: "; see valruns token list --help"},
		{args: []string{"token", "revoke"}, wantErr: "valruns token revoke: want one ID or PREFIX, got 0", wantHelp: "; see valruns token revoke --help"},
		{args: []string{"token", "revoke", "abc"}, wantErr: `valruns token revoke: token "abc": want a token id`, wantHelp: "; see valruns token revoke --help"},
		{args: []string{"token", "revoke", "vr_"}, wantErr: `valruns token revoke: token "vr_": want a token id`, wantHelp: "; see valruns token revoke --help"},
	}
	// Every command refuses a flag it does not have.
	_, leaves := walkCommands()
	for _, l := range leaves {
		tests = append(tests, struct {
			args              []string
			wantErr, wantHelp string
		}{
			args:     append(slices.Clone(l.path), "--no-such-flag"),
			wantErr:  "valruns " + l.name() + ": flag provided but not defined: -no-such-flag",
			wantHelp: "; see valruns " + l.name() + " --help",
		})
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := runCLI(t, tt.args...)
			require.Equal(t, 2, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			require.Empty(t, r.stdout)
			line, rest, _ := strings.Cut(r.stderr, "\n")
			require.Empty(t, rest, "one line on stderr, not the usage: %q", r.stderr)
			require.True(t, strings.HasPrefix(line, tt.wantErr), "line %q, want %q", line, tt.wantErr)
			require.True(t, strings.HasSuffix(line, tt.wantHelp), "line %q ends with where the usage is", line)
			require.NotContains(t, r.stderr, "DATABASE_URL", "a bad call is refused before connecting")
		})
	}
}

func TestOverview(t *testing.T) {
	setEnv(t, unreachableDB)
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		r := runCLI(t, args...)
		require.Equal(t, 0, r.code)
		require.Empty(t, r.stderr)
		require.Equal(t, overview(), r.stdout)
	}
	r := runCLI(t)
	require.Equal(t, 2, r.code, "no command is bad usage")
	require.Empty(t, r.stdout)
	require.Equal(t, "valruns: missing command; see valruns --help\n", r.stderr)

	_, leaves := walkCommands()
	for _, l := range leaves {
		require.Regexp(t, "\n  "+regexp.QuoteMeta("valruns "+synopsis(l.path, l.cmd))+"[ \n]", overview(), "the overview lists %s", l.name())
	}
}

// TestDocsCommands keeps the list of commands in docs/operations.md equal
// to the binary's.
func TestDocsCommands(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(b), "\n## Commands\n")
	require.True(t, ok, "docs/operations.md has a ## Commands section")
	_, block, ok := strings.Cut(section, "```\n")
	require.True(t, ok)
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok)
	require.Equal(t, strings.Join(listing(nil, commands), "\n")+"\n", block,
		"the Commands block of docs/operations.md differs from `valruns help`")
}

func TestMigrateUpStatusDown(t *testing.T) {
	emptyDB(t)
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	sort.Strings(files)
	last := files[len(files)-1]

	r := runCLI(t, "migrate", "status")
	require.Equal(t, 0, r.code, r.stderr)
	for _, f := range files {
		require.Regexp(t, regexp.QuoteMeta(f)+`\s+pending`, r.stdout)
	}

	r = runCLI(t, "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	for _, f := range files {
		require.Contains(t, r.stdout, "applied "+f)
	}
	require.Contains(t, r.stdout, fmt.Sprintf("database at version %d", len(files)))

	r = runCLI(t, "migrate", "status")
	require.Equal(t, 0, r.code, r.stderr)
	for _, f := range files {
		require.Regexp(t, regexp.QuoteMeta(f)+`\s+applied \d{4}-\d\d-\d\dT`, r.stdout)
	}
	require.NotContains(t, r.stdout, "pending")

	r = runCLI(t, "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	require.NotContains(t, r.stdout, "applied 0", "up twice applies nothing the second time")
	require.Contains(t, r.stdout, fmt.Sprintf("database at version %d", len(files)))

	r = runCLI(t, "migrate", "down")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "rolled back "+last)

	r = runCLI(t, "migrate", "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, regexp.QuoteMeta(last)+`\s+pending`, r.stdout)
	require.Regexp(t, regexp.QuoteMeta(files[0])+`\s+applied`, r.stdout)

}

func TestRefusesUnmigratedDatabase(t *testing.T) {
	tests := [][]string{
		{"serve"},
		{"worker"},
		{"org", "create", "Acme"},
		{"org", "list"},
		{"org", "quota", "acme", "5"},
		{"token", "create", "--org", "acme"},
		{"token", "list", "--org", "acme"},
		{"token", "revoke", "vr_abc"},
		{"cleanup"},
		{"demo", "--token-file", filepath.Join(t.TempDir(), "token")},
	}
	for _, args := range tests {
		t.Run(strings.Join(args[:min(2, len(args))], " "), func(t *testing.T) {
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

	require.Contains(t, r.stderr, "This token is shown once", "the reminder, on stderr so that TOKEN=$(...) gets the token alone")

	r2 := runCLI(t, "token", "create", "--org", "acme-inc")
	require.Equal(t, 0, r2.code, r2.stderr)
	require.NotEqual(t, token, strings.TrimSpace(r2.stdout), "every token is new")

	r = runCLI(t, "token", "create", "--org", "nope")
	require.Equal(t, 1, r.code)
	require.Empty(t, r.stdout)
	require.Contains(t, r.stderr, `no organisation with slug "nope"`)
	require.Contains(t, r.stderr, "valruns org create")

	// A name in other letters gets a readable slug, or a refusal naming --slug.
	r = runCLI(t, "org", "create", "Ünïcödé Shop")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, strings.HasPrefix(r.stdout, "slug=unicode-shop id="), r.stdout)
	before := snapshot(t, db)
	r = runCLI(t, "org", "create", "Київ")
	require.Equal(t, 2, r.code, r.stdout)
	require.Contains(t, r.stderr, "Київ has no ASCII spelling")
	require.Contains(t, r.stderr, "--slug SLUG")
	require.Equal(t, before, snapshot(t, db), "nothing created")
	r = runCLI(t, "org", "create", "Київ", "--slug", "kyiv")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, strings.HasPrefix(r.stdout, "slug=kyiv id="), r.stdout)
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
		{name: "unreachable multi-host database", dbURL: "postgres://postgres:s3cret@127.0.0.1:1,127.0.0.1:2/valruns?sslmode=disable&target_session_attrs=read-write",
			args: []string{"serve"}, wantVar: "DATABASE_URL", wantGone: "s3cret"},
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

// serve and worker share their start-up (startProcess): each names the
// setting whose address is taken, its own or PPROF_ADDR.
func TestStartupAddrInUse(t *testing.T) {
	migratedDB(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	free := "127.0.0.1:0"
	for _, tc := range []struct {
		cmd, busy string
		env       map[string]string
	}{
		{"worker", "WORKER_METRICS_ADDR", map[string]string{"WORKER_METRICS_ADDR": ln.Addr().String()}},
		{"worker", "PPROF_ADDR", map[string]string{"WORKER_METRICS_ADDR": free, "PPROF_ADDR": ln.Addr().String()}},
		{"serve", "PPROF_ADDR", map[string]string{"HTTP_ADDR": free, "PPROF_ADDR": ln.Addr().String()}},
	} {
		t.Run(tc.cmd+" "+tc.busy, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			r := runCLI(t, tc.cmd)
			require.Equal(t, 1, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			require.Contains(t, r.stderr, tc.busy)
		})
	}
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
	addr, pprofAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	t.Setenv("HTTP_ADDR", addr)
	t.Setenv("PPROF_ADDR", pprofAddr)
	t.Setenv("MIGRATE_ON_START", "true")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan result, 1)
	go func() {
		var out, errOut bytes.Buffer
		code := Run(ctx, []string{"serve"}, &out, &errOut)
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
	proctest.WaitHTTP(t, "http://"+addr+"/healthz", servedUntil(done))

	for _, path := range []string{"/healthz", "/readyz", "/healthz/", "/readyz/"} {
		code, err := get(path)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, path)
	}
	code, err := get("/api/workflows/")
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code, "the migrated-on-start API answers")

	// PPROF_ADDR: the profiler on its own address, never on the API's.
	code, err = get("/debug/pprof/cmdline")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, code, "no profiler on the API's address")
	resp, err := client.Get("http://" + pprofAddr + "/debug/pprof/cmdline")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the profiler on PPROF_ADDR")

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

func TestOrgCreateRefusesTakenSlug(t *testing.T) {
	db := migratedDB(t)
	count := func() int64 {
		t.Helper()
		var n int64
		require.NoError(t, db.Raw(`SELECT count(*) FROM organizations`).Scan(&n).Error)
		return n
	}

	r := runCLI(t, "org", "create", "Acme Inc")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, strings.HasPrefix(r.stdout, "slug=acme-inc "), r.stdout)

	// The same name again used to create acme-inc-2 without a word.
	r = runCLI(t, "org", "create", "Acme Inc")
	require.Equal(t, 1, r.code, "stdout %q", r.stdout)
	require.Empty(t, r.stdout)
	require.Equal(t, `valruns org create: slug "acme-inc", derived from the name, is taken by another organisation `+
		"(see `valruns org list`): nothing created; choose a slug with --slug SLUG\n", r.stderr)
	require.EqualValues(t, 1, count())

	// --slug, after or before the name.
	r = runCLI(t, "org", "create", "Acme Inc", "--slug", "acme-eu")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, strings.HasPrefix(r.stdout, "slug=acme-eu "), r.stdout)
	r = runCLI(t, "org", "create", "--slug=acme-us", "Acme Inc")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, strings.HasPrefix(r.stdout, "slug=acme-us "), r.stdout)

	// A taken --slug is refused too, naming it.
	r = runCLI(t, "org", "create", "Globex", "--slug", "acme-eu")
	require.Equal(t, 1, r.code)
	require.Equal(t, `valruns org create: slug "acme-eu" is taken by another organisation (see `+"`valruns org list`): nothing created\n", r.stderr)
	require.EqualValues(t, 3, count())

	var names []string
	require.NoError(t, db.Raw(`SELECT slug || '=' || name FROM organizations ORDER BY slug`).Scan(&names).Error)
	require.Equal(t, []string{"acme-eu=Acme Inc", "acme-inc=Acme Inc", "acme-us=Acme Inc"}, names)
}

func TestOrgList(t *testing.T) {
	db := migratedDB(t)

	r := runCLI(t, "org", "list")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "no organisations yet: create one with `valruns org create NAME`\n", r.stdout)
	r = runCLI(t, "org", "list", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	require.JSONEq(t, `[]`, r.stdout)

	ctx := context.Background()
	orgs := models.NewOrgStore(db)
	ids := map[string]string{}
	for _, name := range []string{"Acme", "Globex Corp", "Initech"} {
		o, err := orgs.Create(ctx, name)
		require.NoError(t, err)
		ids[o.Slug] = o.ID
	}
	zero, five := int64(0), int64(5)
	require.NoError(t, orgs.SetQuota(ctx, ids["globex-corp"], &zero))
	require.NoError(t, orgs.SetQuota(ctx, ids["initech"], &five))
	require.NoError(t, orgs.SetStartRate(ctx, ids["initech"], new(7)))
	require.NoError(t, orgs.SetRunShare(ctx, ids["globex-corp"], new(0)))

	r = runCLI(t, "org", "list")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, 4, r.stdout)
	require.Regexp(t, `^SLUG\s+ID\s+QUOTA\s+RATE\s+SHARE\s+CREATED\s+NAME$`, lines[0])
	ts := `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`
	require.Regexp(t, `^acme\s+`+ids["acme"]+`\s+default\s+default\s+default\s+`+ts+`\s+Acme$`, lines[1])
	require.Regexp(t, `^globex-corp\s+`+ids["globex-corp"]+`\s+unlimited\s+default\s+unlimited\s+`+ts+`\s+Globex Corp$`, lines[2])
	require.Regexp(t, `^initech\s+`+ids["initech"]+`\s+5\s+7/s\s+default\s+`+ts+`\s+Initech$`, lines[3])
	require.Equal(t, strings.Index(lines[0], "QUOTA"), strings.Index(lines[2], "unlimited"), "columns align")

	r = runCLI(t, "org", "list", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.Len(t, got, 3)
	quotas, rates, shares := map[string]any{}, map[string]any{}, map[string]any{}
	for _, o := range got {
		require.Equal(t, ids[o["slug"].(string)], o["id"])
		_, err := time.Parse(time.RFC3339Nano, o["created_at"].(string))
		require.NoError(t, err)
		quotas[o["slug"].(string)] = o["monthly_run_quota"]
		rates[o["slug"].(string)] = o["start_rate"]
		shares[o["slug"].(string)] = o["run_share"]
	}
	require.Equal(t, map[string]any{"acme": nil, "globex-corp": 0.0, "initech": 5.0}, quotas)
	require.Equal(t, map[string]any{"acme": nil, "globex-corp": nil, "initech": 7.0}, rates)
	require.Equal(t, map[string]any{"acme": nil, "globex-corp": 0.0, "initech": nil}, shares)
}

// TestOrgRateAndShare: `org rate` and `org share` set an organisation's own
// limits, "default" clears them, and a bad value changes nothing.
func TestOrgRateAndShare(t *testing.T) {
	db := migratedDB(t)
	t.Setenv("ORG_START_RATE", "50")
	t.Setenv("ORG_RUN_SHARE", "0")
	r := runCLI(t, "org", "create", "Acme")
	require.Equal(t, 0, r.code, r.stderr)
	org := func() models.Organization {
		t.Helper()
		var o models.Organization
		require.NoError(t, db.Where("slug = 'acme'").Take(&o).Error)
		return o
	}

	r = runCLI(t, "org", "rate", "acme", "25")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "acme: start rate is now 25 starts per second\n")
	require.Equal(t, 25, *org().StartRate)
	r = runCLI(t, "org", "share", "acme", "unlimited")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "acme: run share is now unlimited\n")
	require.Equal(t, 0, *org().RunShare)

	for _, bad := range []string{"-1", "1.5", "2147483648", "lots"} {
		r = runCLI(t, "org", "rate", "acme", bad)
		require.Equal(t, 2, r.code, bad)
		require.Contains(t, r.stderr, "want a whole number from 0 to 2147483647", bad)
	}
	require.Equal(t, 25, *org().StartRate, "a refused value changes nothing")
	r = runCLI(t, "org", "rate", "nobody", "1")
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, `no organisation with slug "nobody"`)

	r = runCLI(t, "org", "rate", "acme", "default")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "acme: start rate is now default: ORG_START_RATE of the running processes applies (50 starts per second in this environment)\n")
	r = runCLI(t, "org", "share", "acme", "default")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "acme: run share is now default: ORG_RUN_SHARE of the running processes applies (adaptive: 0.5 s of its runs on the worker slots alive in this environment)\n")
	require.Nil(t, org().StartRate)
	require.Nil(t, org().RunShare)
}

// serveInProcess runs `valruns serve` in this process with the test's
// environment, on a free port, and returns its base URL. It stops when the
// test ends.
func serveInProcess(t *testing.T) string {
	t.Helper()
	addr := proctest.FreeAddr(t)
	t.Setenv("HTTP_ADDR", addr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() {
		var out, errOut bytes.Buffer
		code := Run(ctx, []string{"serve"}, &out, &errOut)
		done <- result{code: code, stdout: out.String(), stderr: errOut.String()}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case r := <-done:
			require.Equal(t, 0, r.code, "serve: %s", r.stderr)
		case <-time.After(60 * time.Second):
			t.Error("serve did not stop")
		}
	})
	base := "http://" + addr
	proctest.WaitHTTP(t, base+"/healthz", servedUntil(done))
	return base
}

// servedUntil tells proctest.WaitHTTP whether an in-process serve has
// returned, from the channel its result arrives on.
func servedUntil(done <-chan result) func() (string, bool) {
	return func() (string, bool) {
		select {
		case r := <-done:
			return fmt.Sprintf("exit %d: %s", r.code, r.stderr), true
		default:
			return "", false
		}
	}
}

// call sends a request with a token and returns the status and body.
func call(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestOrgQuota(t *testing.T) {
	db := migratedDB(t)
	// Without the token cache, the server reads the quota on every request,
	// so what the CLI sets is what the next start sees.
	t.Setenv("AUTH_CACHE_TTL", "0")
	t.Setenv("DEFAULT_MONTHLY_RUN_QUOTA", "2")
	base := serveInProcess(t)

	r := runCLI(t, "org", "create", "Acme")
	require.Equal(t, 0, r.code, r.stderr)
	r = runCLI(t, "token", "create", "--org", "acme")
	require.Equal(t, 0, r.code, r.stderr)
	token := strings.TrimSpace(r.stdout)
	quota := func() *int64 {
		t.Helper()
		var org models.Organization
		require.NoError(t, db.Where("slug = 'acme'").Take(&org).Error)
		return org.MonthlyRunQuota
	}

	code, body := call(t, http.MethodPost, base+"/api/workflows/", token, `{"name":"quota"}`)
	require.Equal(t, http.StatusCreated, code, body)
	var wf struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(body), &wf))
	start := func() (int, string) {
		t.Helper()
		return call(t, http.MethodPost, base+"/api/workflows/"+wf.ID+"/start/", token, `{"submission":{}}`)
	}

	r = runCLI(t, "org", "quota", "acme", "1")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "acme: monthly run quota is now 1 runs a month\n"+
		"Running API processes apply it within AUTH_CACHE_TTL (0s in this environment); new ones at once.\n", r.stdout)
	require.Equal(t, int64(1), *quota())
	code, body = start()
	require.Equal(t, http.StatusCreated, code, body)
	code, body = start()
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Contains(t, body, `"code":"quota_exceeded"`)
	require.Contains(t, body, "quota of 1 runs")

	r = runCLI(t, "org", "quota", "acme", "default")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "acme: monthly run quota is now default: DEFAULT_MONTHLY_RUN_QUOTA of the API processes applies (2 runs a month in this environment)\n")
	require.Nil(t, quota())
	code, body = start()
	require.Equal(t, http.StatusCreated, code, "the default of 2 applies: %s", body)
	code, body = start()
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Contains(t, body, "quota of 2 runs")

	for _, unlimited := range []string{"0", "unlimited"} {
		r = runCLI(t, "org", "quota", "acme", unlimited)
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.stdout, "acme: monthly run quota is now unlimited\n")
		require.Equal(t, int64(0), *quota())
	}
	code, body = start()
	require.Equal(t, http.StatusCreated, code, body)

	r = runCLI(t, "org", "quota", "nope", "5")
	require.Equal(t, 1, r.code)
	require.Equal(t, `valruns org quota: no organisation with slug "nope" (list them with `+
		"`valruns org list`, create one with `valruns org create NAME`)\n", r.stderr)
}

func TestTokenListAndRevoke(t *testing.T) {
	db := migratedDB(t)
	t.Setenv("AUTH_CACHE_TTL", "0") // a revocation shows at once
	base := serveInProcess(t)

	r := runCLI(t, "org", "create", "Acme")
	require.Equal(t, 0, r.code, r.stderr)
	r = runCLI(t, "token", "list", "--org", "acme")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "acme has no tokens: create one with `valruns token create --org acme`\n", r.stdout)

	var tokens []string
	for range 3 {
		r = runCLI(t, "token", "create", "--org", "acme")
		require.Equal(t, 0, r.code, r.stderr)
		tokens = append(tokens, strings.TrimSpace(r.stdout))
	}
	var ids []string
	for _, tok := range tokens {
		var id string
		require.NoError(t, db.Raw(`SELECT id FROM api_tokens WHERE token_hash = ?`, models.HashToken(tok)).Scan(&id).Error)
		ids = append(ids, id)
	}
	works := func(tok string) int {
		t.Helper()
		code, _ := call(t, http.MethodGet, base+"/api/workflows/", tok, "")
		return code
	}
	for _, tok := range tokens {
		require.Equal(t, http.StatusOK, works(tok))
	}

	r = runCLI(t, "token", "list", "--org", "acme")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, 4, r.stdout)
	require.Regexp(t, `^ID\s+PREFIX\s+CREATED\s+REVOKED$`, lines[0])
	for i, tok := range tokens {
		require.Regexp(t, `^`+ids[i]+`\s+`+regexp.QuoteMeta(tok[:10])+`\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\s+-$`, lines[i+1])
	}
	require.NotContains(t, r.stdout, tokens[0][10:], "never more of a token than its prefix")

	// By display prefix, as token list shows it.
	r = runCLI(t, "token", "revoke", tokens[0][:10])
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^revoked token `+ids[0]+` \(`+regexp.QuoteMeta(tokens[0][:10])+` of acme\) at \S+\n`+
		`API processes started from now on refuse it; running ones within AUTH_CACHE_TTL \(0s in this environment\)\.\n$`, r.stdout)
	require.Equal(t, http.StatusUnauthorized, works(tokens[0]), "revoked")
	require.Equal(t, http.StatusOK, works(tokens[1]), "the others still work")

	// Again: said, not an error.
	r = runCLI(t, "token", "revoke", ids[0])
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^token `+ids[0]+` \(\S+ of acme\) was already revoked at \S+\n$`, r.stdout)

	// By id, and by the whole token (as a leaked one is found).
	r = runCLI(t, "token", "revoke", ids[1])
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "revoked token "+ids[1])
	r = runCLI(t, "token", "revoke", tokens[2])
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "revoked token "+ids[2])
	for _, tok := range tokens {
		require.Equal(t, http.StatusUnauthorized, works(tok))
	}

	r = runCLI(t, "token", "list", "--org", "acme", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var list []struct {
		ID, Prefix string
		Revoked    *string `json:"revoked_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
	require.Len(t, list, 3)
	for i, tok := range list {
		require.Equal(t, ids[i], tok.ID)
		require.Equal(t, tokens[i][:10], tok.Prefix)
		require.NotNil(t, tok.Revoked, "revoked_at is set")
		_, err := time.Parse(time.RFC3339Nano, *tok.Revoked)
		require.NoError(t, err)
	}

	r = runCLI(t, "token", "revoke", "vr_nomatch")
	require.Equal(t, 1, r.code)
	require.Equal(t, `valruns token revoke: no token matches "vr_nomatch" (list an organisation's tokens with `+
		"`valruns token list --org SLUG`)\n", r.stderr)
	r = runCLI(t, "token", "list", "--org", "nope")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `valruns token list: no organisation with slug "nope"`)
}

func TestTokenRevokeAmbiguousPrefix(t *testing.T) {
	db := migratedDB(t)
	var orgID string
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&orgID).Error)
	// Two tokens whose display prefixes share their start (7 random
	// characters make it rare, not impossible).
	var ids []string
	for _, display := range []string{"vr_abcd111", "vr_abcd222"} {
		var id string
		require.NoError(t, db.Raw(`INSERT INTO api_tokens (org_id, token_hash, display) VALUES (?, sha256(?::bytea), ?) RETURNING id`,
			orgID, display, display).Scan(&id).Error)
		ids = append(ids, id)
	}
	revoked := func() []string {
		t.Helper()
		var d []string
		require.NoError(t, db.Raw(`SELECT display FROM api_tokens WHERE revoked_at IS NOT NULL ORDER BY display`).Scan(&d).Error)
		return d
	}

	r := runCLI(t, "token", "revoke", "vr_abcd")
	require.Equal(t, 1, r.code, r.stdout)
	require.Equal(t, `valruns token revoke: "vr_abcd" matches 2 tokens: name one by its id: `+
		ids[0]+` (vr_abcd111 of acme), `+ids[1]+` (vr_abcd222 of acme); nothing revoked`+"\n", r.stderr)
	require.Empty(t, revoked())

	// A prefix is literal: the _ of vr_ is no wildcard.
	r = runCLI(t, "token", "revoke", "vrxabcd1")
	require.Equal(t, 2, r.code, "not a token reference")
	r = runCLI(t, "token", "revoke", "vr_abc_111")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no token matches")

	r = runCLI(t, "token", "revoke", "vr_abcd2")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "revoked token "+ids[1])
	require.Equal(t, []string{"vr_abcd222"}, revoked())
}

// TestBinaryExitCodes runs the real binary: the exit codes Run chooses
// are the process's.
func TestBinaryExitCodes(t *testing.T) {
	db, dbURL := testdb.New(t)
	bin := proctest.Binary(t)
	tests := []struct {
		args     []string
		wantCode int
		// wantOut starts stdout, wantErr stderr.
		wantOut, wantErr string
	}{
		{args: []string{"org", "create", "--help"}, wantCode: 0, wantOut: "Usage: valruns org create NAME"},
		{args: []string{"migrate", "status", "--help"}, wantCode: 0, wantOut: "Usage: valruns migrate status\n"},
		{args: []string{"token"}, wantCode: 2, wantErr: "valruns token: missing subcommand; see valruns token --help\n"},
		{args: []string{"org", "quota", "nope", "5"}, wantCode: 1, wantErr: `valruns org quota: no organisation with slug "nope"`},
		// A negative number is an operand, judged as a quota, not a flag "-5".
		{args: []string{"org", "quota", "nope", "-5"}, wantCode: 2, wantErr: `valruns org quota: quota "-5": want a whole number >= 0 (0: unlimited) or default; see valruns org quota --help` + "\n"},
		{args: []string{"org", "create", "Acme", "--slug", ""}, wantCode: 2, wantErr: "valruns org create: --slug is empty"},
		{args: []string{"org", "list"}, wantCode: 0, wantOut: "no organisations yet"},
		{args: []string{"version"}, wantCode: 0, wantOut: "valruns " + Release + "\nrevision "},
		{args: []string{"--version"}, wantCode: 0, wantOut: "valruns " + Release + "\nrevision "},
		{args: []string{"serv"}, wantCode: 2, wantErr: `valruns: unknown command "serv" (did you mean "serve"?); see valruns --help` + "\n"},
		{args: []string{"org", "creat", "Acme"}, wantCode: 2, wantErr: `valruns org: unknown subcommand "creat" (did you mean "create"?); see valruns org --help` + "\n"},
		{args: []string{"org", "create", "東京"}, wantCode: 2, wantErr: `valruns org create: NAME: name "東京": 東京 has no ASCII spelling to derive a readable slug from: give the slug with --slug SLUG`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := startBin(t, bin, []string{"DATABASE_URL=" + dbURL, "LOG_LEVEL=error"}, "", tt.args...)
			require.Equal(t, tt.wantCode, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
			require.True(t, strings.HasPrefix(r.stdout, tt.wantOut), "stdout %q", r.stdout)
			require.True(t, strings.HasPrefix(r.stderr, tt.wantErr), "stderr %q", r.stderr)
		})
	}
	var n int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM organizations`).Scan(&n).Error)
	require.Zero(t, n, "org create --help created nothing")
}

func TestMain(m *testing.M) { os.Exit(proctest.Run(m)) }
