package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
)

// TestQuoteReadsBackAsTheSameText: PostgreSQL reads every literal quote
// writes as the original text, colons, quotes, backslashes and control
// characters included.
func TestQuoteReadsBackAsTheSameText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := testdb.New(t, testdb.Options{Empty: true, MaxOpenConns: 1})
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, s := range []string{"", "plain", "a:b", `{"total":42}`, "it's", `back\slash`, "tab\tnew\nline\r", "\x01\x1f", "ünïcödé", `\x0102`, "::uuid"} {
		var got string
		require.NoError(t, conn.QueryRow(ctx, "SELECT "+quote(s)).Scan(&got), s)
		require.Equal(t, s, got)
		require.NotContains(t, quote(s), ":", "pgbench would read a colon as a variable")
	}
}

func TestSubstitute(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, sql, want string }{
		{"placeholders", `SELECT $1, $2, $10`, `SELECT A, B, J`},
		{"not in literals", `SELECT '$1', $1`, `SELECT '$1', A`},
		{"not in identifiers", `SELECT "$1", $1`, `SELECT "$1", A`},
		{"not in dollar quotes", `SELECT $q$ $1 $q$, $1`, `SELECT $q$ $1 $q$, A`},
		{"colon literal re-quoted", `SELECT 'validation_run:' || $1`, `SELECT E'validation_run\072' || A`},
		{"escaped literal with colon", `SELECT E'a:\'b', $1`, `SELECT E'a\072\'b', A`},
		{"doubled quote", `SELECT 'it''s:x'`, `SELECT E'it\'s\072x'`},
		{"casts untouched", `SELECT $1::uuid, x::text`, `SELECT A::uuid, x::text`},
		{"comments lose colons", "SELECT 1 -- note: $1\n, $1", "SELECT 1 -- note  $1\n, A"},
		{"block comment", `SELECT /* a:b */ $2`, `SELECT /* a b */ B`},
		{"identifier ending in digit then $", `SELECT a$1`, `SELECT a$1`},
	}
	exprs := []string{"A", "B", "C", "D", "E", "F", "G", "H", "I", "J"}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := substitute(tc.sql, exprs)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	_, err := substitute(`SELECT $3`, exprs[:2])
	require.ErrorContains(t, err, "$3")
	_, err = substitute(`SELECT 'open`, nil)
	require.Error(t, err)
}

func TestIntRange(t *testing.T) {
	t.Parallel()
	cases := []struct{ a, b, want string }{
		{"3", "7", "0, 32767"},
		{"-3", "7", "-32767, 32767"},
		{"3377506150", "2804615410", "0, 4294967295"}, // a 32-bit half of a lock id, cast to oid
		{"-1940465614", "5", "-2147483647, 2147483647"},
		{"-3940465614616065806", "12", "-4611686018427387903, 4611686018427387903"},
		{"9223372036854775807", "1", "1, 9223372036854775806"},
		{"-9223372036854775808", "1", "-4611686018427387903, 4611686018427387903"},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, intRange(tc.a, tc.b), "%s %s", tc.a, tc.b)
	}
}

func TestCheckColons(t *testing.T) {
	t.Parallel()
	require.NoError(t, checkColons("\\set r1 random(1, 2)\nSELECT :r1::text, :norgs;\nSELECT 1 \\gset s1_\nSELECT :s1_id;\n-- a comment :x\n"))
	require.ErrorContains(t, checkColons("SELECT :nope;\n"), ":nope")
}

func stmt(conn, burst int, sql string, params ...string) wireStmt {
	s := wireStmt{Conn: conn, Burst: burst, SQL: sql}
	for _, p := range params {
		s.Params = append(s.Params, wireParam{OID: 25, Text: p})
	}
	return s
}

// TestBuildScriptClassifiesValues: equal everywhere -> literal; equal in
// one org but not across orgs -> array by :org; different between two
// requests -> fresh, the same fresh value wherever it recurs.
func TestBuildScriptClassifiesValues(t *testing.T) {
	t.Parallel()
	const org1, org2 = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
	const idA, idB = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"
	req := func(org, id, lock string) requestCapture {
		return requestCapture{RoundTrips: 2, Stmts: []wireStmt{
			stmt(1, 1, `SELECT $1, $2, $3`, "constant", org, lock),
			stmt(1, 2, `INSERT INTO t VALUES ($1, $2, $3)`, id, "run:"+id, org+"/"+id),
		}}
	}
	sc, err := buildScript(req(org1, idA, "17"), req(org1, idB, "99"), []requestCapture{req(org2, idA, "5")}, map[uint32]string{25: "text"})
	require.NoError(t, err)
	lines := strings.Split(sc.Text, "\n")
	require.Contains(t, lines, `\set r1 random(0, 32767)`)
	require.Contains(t, sc.Text, `CAST(E'constant' AS text)`)
	require.Contains(t, sc.Text, fmt.Sprintf(`(CAST(ARRAY[E'%s',E'%s'] AS text[]))[:org]`, org1, org2))
	require.Contains(t, sc.Text, `CAST(:r1 AS text)`)
	require.Contains(t, sc.Text, `CAST(CAST(md5(:r2::text) AS uuid) AS text)`, "a per-request UUID is fresh")
	require.Contains(t, sc.Text, `(E'run\072' || CAST(md5(:r2::text) AS uuid)::text)`, "the same fresh UUID where it recurs")
	require.Contains(t, sc.Text, `((CAST(ARRAY[E'`+org1+`',E'`+org2+`'] AS uuid[]))[:org]::text || E'/' || CAST(md5(:r2::text) AS uuid)::text)`)
	require.NotContains(t, sc.Text, idA)
	require.Equal(t, 2, sc.Statements)
	require.Equal(t, 2, sc.MaxOrgs)

	// Captures whose statements differ are refused, or left out for an organisation.
	bad := req(org1, idB, "99")
	bad.Stmts[0].SQL = "SELECT 2"
	_, err = buildScript(req(org1, idA, "17"), bad, nil, nil)
	require.Error(t, err)
	sc, err = buildScript(req(org1, idA, "17"), req(org1, idB, "99"), []requestCapture{bad}, nil)
	require.NoError(t, err)
	require.Equal(t, 1, sc.MaxOrgs)
	require.Len(t, sc.Notes, 1)
}
