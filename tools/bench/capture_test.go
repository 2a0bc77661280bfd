package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
)

// proxied starts a capture in front of the database at dbURL and returns it
// with the URL that goes through it.
func proxied(t *testing.T, dbURL string) (*capture, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	c, err := newCapture(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.Host = c.Addr().String()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	return c, u.String()
}

// TestCaptureRecordsWhatTheClientSent: statements, parameters in text form
// (binary ones decoded), results, and round trips (a pipelined batch is
// one; a ping is none), through pgx's default statement cache.
func TestCaptureRecordsWhatTheClientSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := testdb.New(t, testdb.Options{Empty: true, MaxOpenConns: 1})
	c, via := proxied(t, dbURL)
	conn, err := pgx.Connect(ctx, via)
	require.NoError(t, err)
	defer conn.Close(ctx)

	id := uuid.New()
	ts := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	const sel = `SELECT $1::uuid AS u, $2::int8 AS n, $3::bytea AS b, $4::jsonb AS j, $5::text AS t, $6::timestamptz AS ts`
	args := []any{id, int64(-42), []byte{1, 2, 0xff}, map[string]any{"a": 1}, "a:b 'c'", ts}
	request := func() {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		var u uuid.UUID
		var n int64
		var b []byte
		var j map[string]any
		var s string
		var tt time.Time
		require.NoError(t, tx.QueryRow(ctx, sel, args...).Scan(&u, &n, &b, &j, &s, &tt))
		batch := &pgx.Batch{}
		batch.Queue(`SELECT $1::int4 + 1`, 1)
		batch.Queue(`SELECT $1::text || 'x'`, "y")
		require.NoError(t, tx.SendBatch(ctx, batch).Close())
		require.NoError(t, conn.Ping(ctx))
		require.NoError(t, tx.Commit(ctx))
	}
	request() // prepares the statements
	from := c.Mark()
	request()
	rc := summarize(c.Window(from, c.Mark()))

	require.Empty(t, rc.Errors)
	var sqls []string
	for _, s := range rc.Stmts {
		sqls = append(sqls, s.SQL)
	}
	require.Equal(t, []string{"begin", sel, `SELECT $1::int4 + 1`, `SELECT $1::text || 'x'`, "commit"}, sqls)
	require.Equal(t, 4, rc.RoundTrips, "begin, select, the batch, commit; the ping is not counted")
	require.Zero(t, rc.PrepareRoundTrips)
	require.Equal(t, [2]int{rc.Stmts[2].Conn, rc.Stmts[2].Burst}, [2]int{rc.Stmts[3].Conn, rc.Stmts[3].Burst}, "a batch is one round trip")
	require.NotEqual(t, rc.Stmts[1].Burst, rc.Stmts[2].Burst)

	p := rc.Stmts[1].Params
	require.Len(t, p, 6)
	require.Equal(t, id.String(), p[0].Text)
	require.Equal(t, "-42", p[1].Text)
	require.Equal(t, `\x0102ff`, p[2].Text)
	require.JSONEq(t, `{"a":1}`, p[3].Text)
	require.Equal(t, "a:b 'c'", p[4].Text)
	for _, x := range p {
		require.False(t, x.Undecoded)
	}
	// The timestamp's text is what PostgreSQL reads as the same instant.
	var same bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT $1::timestamptz = $2`, p[5].Text, ts).Scan(&same))
	require.True(t, same, "timestamptz text %q", p[5].Text)

	sel1 := rc.Stmts[1]
	require.Equal(t, []string{"u", "n", "b", "j", "t", "ts"}, sel1.Columns)
	require.Equal(t, 1, sel1.RowCount)
	require.Equal(t, id.String(), sel1.Rows[0][0].Text)
	require.Equal(t, "-42", sel1.Rows[0][1].Text)
}

// TestCaptureCountsPreparesApart: the first use of a statement on a
// connection costs a round trip that only prepares it.
func TestCaptureCountsPreparesApart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := testdb.New(t, testdb.Options{Empty: true, MaxOpenConns: 1})
	c, via := proxied(t, dbURL)
	conn, err := pgx.Connect(ctx, via)
	require.NoError(t, err)
	defer conn.Close(ctx)

	from := c.Mark()
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT $1::int + 1`, 1).Scan(&n))
	rc := summarize(c.Window(from, c.Mark()))
	require.Equal(t, 2, rc.RoundTrips)
	require.Equal(t, 1, rc.PrepareRoundTrips)
	require.Len(t, rc.Stmts, 1)
	require.Equal(t, "1", rc.Stmts[0].Params[0].Text)
	require.Equal(t, "2", rc.Stmts[0].Rows[0][0].Text)

	from = c.Mark()
	require.NoError(t, conn.QueryRow(ctx, `SELECT $1::int + 1`, 5).Scan(&n))
	rc = summarize(c.Window(from, c.Mark()))
	require.Equal(t, 1, rc.RoundTrips)
	require.Zero(t, rc.PrepareRoundTrips)
}

// TestCaptureRecordsServerErrors: a failing statement shows up as an error
// of the request.
func TestCaptureRecordsServerErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := testdb.New(t, testdb.Options{Empty: true, MaxOpenConns: 1})
	c, via := proxied(t, dbURL)
	conn, err := pgx.Connect(ctx, via)
	require.NoError(t, err)
	defer conn.Close(ctx)
	from := c.Mark()
	_, err = conn.Exec(ctx, `SELECT 1/0`)
	require.Error(t, err)
	rc := summarize(c.Window(from, c.Mark()))
	require.Len(t, rc.Errors, 1)
	require.Contains(t, rc.Errors[0], "22012")
}

// miniApp is a request shaped like a start: a lock on a random number, an
// insert whose id and sequence number the database makes (RETURNING), a row that links it
// under an id the client makes, with texts and bytes that embed both, a
// pipelined pair, in one transaction.
func miniApp(ctx context.Context, conn *pgx.Conn, org string) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(uuid.New().ID())<<20).Scan(&ok); err != nil {
		return err
	}
	var item string
	var seq int64
	if err := tx.QueryRow(ctx, `INSERT INTO items (org_id, key) VALUES ($1, $2) RETURNING id, seq`, org, uuid.NewString()).Scan(&item, &seq); err != nil {
		return err
	}
	link := uuid.NewString()
	body := fmt.Sprintf(`{"item":"%s","link":"%s","org":"%s"}`, item, link, org)
	if _, err := tx.Exec(ctx, `INSERT INTO links (id, item_id, org_id, note, body, item_seq) VALUES ($1, $2, $3, $4, $5, $6)`,
		link, item, org, "item:"+item, []byte(body), seq); err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(`UPDATE items SET n = n + 1 WHERE id = $1`, item)
	b.Queue(`SELECT count(*) FROM links WHERE org_id = $1`, org)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// TestScriptFromCaptureRunsInPgbench: captures of miniApp become a pgbench
// script that runs without errors, makes fresh ids where the client made
// them, reads back the ids the database made, rebuilds the texts that
// embed them, and spreads over the organisations with norgs.
func TestScriptFromCaptureRunsInPgbench(t *testing.T) {
	t.Parallel()
	needTool(t, "pgbench")
	ctx := context.Background()
	_, dbURL := testdb.New(t, testdb.Options{Empty: true, MaxOpenConns: 1})
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `
CREATE TABLE orgs (id uuid PRIMARY KEY);
CREATE TABLE items (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), seq bigserial, org_id uuid NOT NULL REFERENCES orgs,
	key text NOT NULL, n bigint NOT NULL DEFAULT 0, UNIQUE (org_id, key));
CREATE TABLE links (id uuid PRIMARY KEY, item_id uuid NOT NULL REFERENCES items, org_id uuid NOT NULL REFERENCES orgs,
	note text NOT NULL, body bytea NOT NULL, item_seq bigint NOT NULL);`)
	require.NoError(t, err)
	orgs := []string{uuid.NewString(), uuid.NewString(), uuid.NewString()}
	for _, o := range orgs {
		_, err := admin.Exec(ctx, `INSERT INTO orgs VALUES ($1)`, o)
		require.NoError(t, err)
	}

	c, via := proxied(t, dbURL)
	conn, err := pgx.Connect(ctx, via)
	require.NoError(t, err)
	defer conn.Close(ctx)
	capture := func(org string) requestCapture {
		require.NoError(t, miniApp(ctx, conn, org)) // warm: statements prepared
		from := c.Mark()
		require.NoError(t, miniApp(ctx, conn, org))
		rc := summarize(c.Window(from, c.Mark()))
		require.Empty(t, rc.Errors)
		return rc
	}
	a, b := capture(orgs[0]), capture(orgs[0])
	others := []requestCapture{capture(orgs[1]), capture(orgs[2])}
	names, err := typeNames(ctx, admin, a)
	require.NoError(t, err)
	sc, err := buildScript(a, b, others, names)
	require.NoError(t, err)
	require.Equal(t, 6, sc.RoundTrips, "begin, lock, insert, link, the batch, commit")
	require.Equal(t, 7, sc.Statements)
	require.Equal(t, 3, sc.MaxOrgs)
	require.Equal(t, 1, sc.Pipelines)
	require.Contains(t, sc.Text, `\gset s3_`, "the item id is read back from the insert's result")
	require.Contains(t, sc.Text, `\startpipeline`)
	require.NotContains(t, sc.Text, a.Stmts[3].Params[0].Text, "the client-made link id is fresh in each transaction")

	path := t.TempDir() + "/script.sql"
	require.NoError(t, os.WriteFile(path, []byte(sc.Text), 0o644))
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	u, _ := url.Parse(dbURL)
	e := &env{pg: cfg, baseURL: u}
	dbName := strings.TrimPrefix(u.Path, "/")
	count := func(q string, args ...any) int {
		var n int
		require.NoError(t, admin.QueryRow(ctx, q, args...).Scan(&n))
		return n
	}
	// Only pgbench's rows from here on.
	_, err = admin.Exec(ctx, `DELETE FROM links; DELETE FROM items`)
	require.NoError(t, err)

	res := e.pgbench(ctx, dbName, path, 1, 2, "-t", "10")
	require.False(t, res.Aborted, res.Output)
	require.Equal(t, 20, res.Done, res.Output)
	require.Equal(t, 20, count(`SELECT count(*) FROM links`))
	require.Equal(t, 20, count(`SELECT count(*) FROM items WHERE n = 1`), "the pipelined update ran on each transaction's item")
	// Every new link points at the item made in its own transaction, and
	// its texts embed that item's id.
	require.Zero(t, count(`SELECT count(*) FROM links l JOIN items i ON i.id = l.item_id
		WHERE l.note <> 'item:' || i.id OR convert_from(l.body, 'UTF8')::jsonb->>'item' <> i.id::text`))
	require.Zero(t, count(`SELECT count(*) FROM links l JOIN items i ON i.id = l.item_id WHERE l.item_seq <> i.seq`),
		"an integer the database made is read back too")
	require.Equal(t, 1, count(`SELECT count(DISTINCT org_id) FROM links`), "norgs=1: one organisation")

	res = e.pgbench(ctx, dbName, path, 3, 2, "-t", "20")
	require.False(t, res.Aborted, res.Output)
	require.Equal(t, 40, res.Done, res.Output)
	require.Equal(t, 3, count(`SELECT count(DISTINCT org_id) FROM links`), "norgs=3: spread over the organisations")
	require.Zero(t, count(`SELECT count(*) FROM links l JOIN items i ON i.id = l.item_id
		WHERE l.org_id <> i.org_id OR convert_from(l.body, 'UTF8')::jsonb->>'org' <> l.org_id::text`),
		"each transaction uses one organisation throughout")
}
