package models

import (
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

var (
	dollarParam = regexp.MustCompile(`\$([0-9]+)`)
	namedParam  = regexp.MustCompile(`@([a-z_][a-z0-9_]*)`)
)

// SQL that is no file's statement has no name.
func TestStatementNameOfOtherSQL(t *testing.T) {
	t.Parallel()
	require.Empty(t, StatementName("SELECT 1"))
	require.Empty(t, StatementName(Statement("start_batch")+" "), "the text as sent, exactly")
}

// A statement sent through GORM reaches pgx, and so the tracer, with its
// placeholders rewritten: it keeps its name (a span named "authenticate",
// not "SELECT o.id AS org_id, ..."). Each file's statement is rendered as
// GORM sends it, with an argument for each placeholder.
func TestStatementNameAsGORMSendsIt(t *testing.T) {
	t.Parallel()
	db, err := gorm.Open(postgres.New(postgres.Config{DSN: "host=unused.invalid"}), &gorm.Config{DryRun: true, DisableAutomaticPing: true}) // no connection
	require.NoError(t, err)
	names, err := fs.Glob(sqlFiles, "sql/*.sql")
	require.NoError(t, err)
	gormed := 0
	for _, path := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(path, "sql/"), ".sql")
		text := Statement(name)
		var args []any
		for range strings.Count(text, "?") {
			args = append(args, 1)
		}
		if named := namedParam.FindAllStringSubmatch(text, -1); len(named) > 0 {
			m := map[string]any{}
			for _, n := range named {
				m[n[1]] = 1
			}
			args = append(args, m)
		}
		if len(args) == 0 {
			continue // sent to pgx as written
		}
		gormed++
		sent := db.Raw(text, args...).Statement.SQL.String()
		require.NotEqual(t, text, sent, "%s: GORM rewrote its placeholders", name)
		require.Equal(t, name, StatementName(sent), "%s as GORM sends it:\n%s", name, sent)
	}
	require.NotZero(t, gormed)
	// A slice GORM expands into a list of placeholders.
	sent := db.Raw(authenticateSQL, []any{[]byte("a"), []byte("b")}).Statement.SQL.String()
	require.Contains(t, sent, "($1,$2)")
	require.Equal(t, "authenticate", StatementName(sent))
}

// Every file under sql/ is a statement the package sends, and its leading
// comment documents each of its parameters, no more and no fewer: $1..$n
// for pgx's, ?1..?n for GORM's ? placeholders in order, @name for GORM's
// named ones.
func TestSQLFilesAreUsedAndDocumented(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(sqlFiles, "sql/*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	for _, path := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(path, "sql/"), ".sql")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.True(t, usedStatements[name], "sql/%s.sql is loaded by no statement(%q)", name, name)
			require.Equal(t, name, StatementName(Statement(name)), "its text names it (tracing's span name)")
			file, err := fs.ReadFile(sqlFiles, path)
			require.NoError(t, err)
			body := statementOf(string(file))
			comment := string(file)[:strings.Index(string(file), body)]
			require.True(t, strings.HasPrefix(comment, "-- "+name+".sql: "), "the comment starts by naming the file and saying what it does")
			require.NotContains(t, body, "\n--", "one leading comment; none inside the statement")

			var want []string
			maxDollar := 0
			for _, m := range dollarParam.FindAllStringSubmatch(body, -1) {
				var n int
				fmt.Sscan(m[1], &n)
				maxDollar = max(maxDollar, n)
			}
			for n := 1; n <= maxDollar; n++ {
				want = append(want, fmt.Sprintf("$%d", n))
			}
			for n := 1; n <= strings.Count(body, "?"); n++ {
				want = append(want, fmt.Sprintf("?%d", n))
			}
			for _, m := range namedParam.FindAllStringSubmatch(body, -1) {
				if !slices.Contains(want, m[0]) {
					want = append(want, m[0])
				}
			}
			var documented []string
			for _, m := range regexp.MustCompile(`[$?][0-9]+|@[a-z_][a-z0-9_]*`).FindAllString(comment, -1) {
				if !slices.Contains(documented, m) {
					documented = append(documented, m)
				}
			}
			require.ElementsMatch(t, want, documented, "parameters used (left) and documented in the comment (right)")
		})
	}
}

// record_attempt.sql names the test event's type by its value.
func TestRecordAttemptNamesEventTest(t *testing.T) {
	t.Parallel()
	require.Contains(t, recordAttemptSQL, "event_type = '"+EventTest+"'")
}

// Every statement that ends runs does the same after its UPDATE (the run
// leaves unfinished_runs, its event goes to the outbox, endedRun is read
// back): written out in each file, so that each reads whole, and kept the
// same here.
func TestStatementsThatEndRunsShareTheirEnd(t *testing.T) {
	t.Parallel()
	tail := func(sql string) string {
		t.Helper()
		i := strings.Index(sql, "), unlisted AS (")
		require.GreaterOrEqual(t, i, 0, "%s", sql)
		return sql[i:]
	}
	want := tail(finishRunSQL)
	for name, sql := range map[string]string{"fail_run": failRunSQL, "fail_attempt": failAttemptSQL, "finish_unclaimed": finishUnclaimedSQL} {
		require.Equal(t, want, tail(sql), "%s.sql ends otherwise than finish_run.sql", name)
	}
}
