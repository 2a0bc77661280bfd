package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/testdb"
)

// TestSpliceSection: make bench-e2e replaces the experiment log of
// RESULTS.md and keeps everything else byte for byte; a file without one
// gets it appended; a heading inside a code block is not a section.
func TestSpliceSection(t *testing.T) {
	t.Parallel()
	doc := "# results\n\n## Ratios\n\nkeep me\n\n## Experiment log\n\nold figures\n\n### sub\n\nold too\n\n## SQL\n\n```\n## Experiment log\n```\n"
	got := spliceSection(doc, expHeading, "## Experiment log\n\nnew figures\n")
	require.Equal(t, "# results\n\n## Ratios\n\nkeep me\n\n## Experiment log\n\nnew figures\n\n## SQL\n\n```\n## Experiment log\n```\n", got)

	// Last section of the file.
	got = spliceSection("# r\n\n## Experiment log\n\nold\n", expHeading, "## Experiment log\n\nnew\n")
	require.Equal(t, "# r\n\n## Experiment log\n\nnew\n", got)

	// None yet, and the only mention is in a code block.
	got = spliceSection("# r\n\n```\n## Experiment log\n```", expHeading, "## Experiment log\n\nnew")
	require.Equal(t, "# r\n\n```\n## Experiment log\n```\n\n## Experiment log\n\nnew\n", got)
	require.Equal(t, "## Experiment log\n\nnew\n", spliceSection("", expHeading, "## Experiment log\n\nnew"))
}

func TestParseCLIAnswers(t *testing.T) {
	t.Parallel()
	slug, id, err := parseOrgCreate("slug=bench-e2e-now id=0b3c0f8e-1b7a-4f4e-9d5e-1e1f6c1d2a3b\n")
	require.NoError(t, err)
	require.Equal(t, "bench-e2e-now", slug)
	require.Equal(t, "0b3c0f8e-1b7a-4f4e-9d5e-1e1f6c1d2a3b", id)
	_, _, err = parseOrgCreate("created\n")
	require.ErrorContains(t, err, "not slug=")
	require.Equal(t, "vr_abc", lastLine("note: shown once\nvr_abc\n\n"))
	require.Equal(t, "", lastLine("\n \n"))

	got, err := parseInts("10, 20,50")
	require.NoError(t, err)
	require.Equal(t, []int{10, 20, 50}, got)
	for _, bad := range []string{"", "10,,20", "0", "-5", "ten"} {
		_, err := parseInts(bad)
		require.Error(t, err, bad)
	}
}

// TestPhaseWorkSums: the per-run figures add the right WAL record kinds and
// divide by the phase's runs; without pg_walinspect the WAL is the
// cluster's difference.
func TestPhaseWorkSums(t *testing.T) {
	t.Parallel()
	p := phaseWork{Runs: 10, ClusterWAL: 99_000, WAL: map[string]walKind{
		"Heap/INSERT":             {Records: 20, Bytes: 4000, FPIs: 2, FPIBytes: 1600},
		"Heap/INSERT+INIT":        {Records: 1, Bytes: 200},
		"Heap2/MULTI_INSERT":      {Records: 1, Bytes: 100},
		"Heap/HOT_UPDATE":         {Records: 10, Bytes: 1000},
		"Heap/UPDATE":             {Records: 5, Bytes: 800},
		"Heap/DELETE":             {Records: 10, Bytes: 500},
		"Heap/LOCK":               {Records: 30, Bytes: 1500},
		"Heap2/PRUNE":             {Records: 3, Bytes: 300},
		"Btree/INSERT_LEAF":       {Records: 40, Bytes: 2600},
		"Btree/INSERT_POST":       {Records: 2, Bytes: 100},
		"Btree/SPLIT_L":           {Records: 1, Bytes: 8000, FPIs: 1, FPIBytes: 7000},
		"Transaction/COMMIT":      {Records: 10, Bytes: 500},
		"Transaction/COMMIT_PREP": {Records: 1, Bytes: 50},
		"Transaction/ABORT":       {Records: 1, Bytes: 50},
	}, Tables: []tableWork{{Table: "a", Ins: 10, Upd: 5, HotUpd: 3}, {Table: "b", Ins: 10, Del: 10}}}
	require.EqualValues(t, 22, p.heap("INSERT", "INSERT+INIT", "MULTI_INSERT"))
	require.EqualValues(t, 15, p.heap("UPDATE", "HOT_UPDATE"))
	require.EqualValues(t, 30, p.heap("LOCK"))
	require.EqualValues(t, 42, p.indexInserts())
	require.EqualValues(t, 11, p.commits())
	all := p.all()
	require.EqualValues(t, 19700, all.Bytes)
	require.EqualValues(t, 3, all.FPIs)
	require.EqualValues(t, 8600, all.FPIBytes)
	require.EqualValues(t, 19700, p.walBytes())
	require.InDelta(t, 1970, p.per(p.walBytes()), 1e-9)
	ins, upd, hot, del := p.rows()
	require.Equal(t, [4]int64{20, 5, 3, 10}, [4]int64{ins, upd, hot, del})

	p.WAL = nil
	require.EqualValues(t, 99_000, p.walBytes())
	require.Zero(t, phaseWork{}.per(5), "no runs: no division by zero")
}

func TestDiffTablesAndTopStatements(t *testing.T) {
	t.Parallel()
	before := map[string]tableWork{"runs": {Table: "runs", Ins: 5, Upd: 1}, "quiet": {Table: "quiet", Ins: 7}}
	after := map[string]tableWork{"runs": {Table: "runs", Ins: 15, Upd: 4, HotUpd: 2}, "quiet": {Table: "quiet", Ins: 7},
		"keys": {Table: "keys", Ins: 10, Del: 1}}
	require.Equal(t, []tableWork{{Table: "keys", Ins: 10, Del: 1}, {Table: "runs", Ins: 10, Upd: 3, HotUpd: 2}}, diffTables(before, after))

	stmts := []wireStmt{{SQL: "begin"}, {SQL: "SELECT 1\n  FROM   t"}, {SQL: "begin"}, {SQL: "SELECT 1 FROM t"}, {SQL: "begin"}, {SQL: "commit"}}
	require.Equal(t, []stmtCount{{"begin", 3}, {"SELECT 1 FROM t", 2}, {"commit", 1}}, topStatements(stmts, 5))
	require.Equal(t, []stmtCount{{"begin", 3}}, topStatements(stmts, 1))
}

func exampleLog() *experimentLog {
	phase := func(runs int, wal int64, stmts int) phaseWork {
		return phaseWork{Runs: runs, WAL: map[string]walKind{"Heap/INSERT": {Records: int64(runs), Bytes: wal}}, Stmts: stmts, RoundTrips: stmts}
	}
	return &experimentLog{Date: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC), Mode: "full", Now: "abc123", Baseline: "0b107b5",
		BaselineCommit: "0b107b5209220af0100137a19e821442c9f80c9c", Clients: 32, Dur: time.Minute, PgWorkRuns: 100,
		PgWork: []pgWorkResult{
			{Side: "now", Start: phase(100, 100_000, 200), Exec: phase(100, 100_000, 100), Walinspect: true},
			{Side: "baseline", Start: phase(100, 300_000, 500), Exec: phase(100, 200_000, 400), Walinspect: true},
		},
		E2E: []e2eResult{
			{Side: "now", Mode: modeInline.Name, Clients: 32, Window: 10 * time.Second, Started: 10_000, Finished: 9_600, HasRunning: true, RunningP50: 20 * time.Millisecond},
			{Side: "baseline", Mode: modeInline.Name, Clients: 32, Window: 10 * time.Second, Started: 5_000, Finished: 3_000, FinalP50: time.Second, FinalP99: 2 * time.Second},
			{Side: "now", Mode: modeSeparate.Name, Clients: 32, Window: 10 * time.Second, Started: 10_000, Finished: 9_000},
			{Side: "peer", Mode: peerSeparate.Name, Clients: 32, Window: 10 * time.Second, Started: 7_000, Finished: 5_000},
		},
		Drain: []drainResult{{Side: "now", Queued: 1000, Points: []drainPoint{{Concurrency: 10, Runs: 1000, Elapsed: 2 * time.Second}, {Concurrency: 50, Failed: "boom"}}}},
	}
}

// TestExperimentChecks: issue 15's targets compare the right figures of one
// run and pass only when met; a missing side is "no data", never a pass.
func TestExperimentChecks(t *testing.T) {
	t.Parallel()
	x := exampleLog()
	got := byName(x.checks())
	wal := got["WAL bytes per run (start + execution), now vs baseline"]
	require.True(t, wal.Pass, wal.Measured) // 2000 / 5000 bytes
	require.Contains(t, wal.Measured, "0.40x (2000 / 5000 bytes)")
	inline := got["e2e serve --worker: runs finished / runs started over the loop"]
	require.True(t, inline.Pass, inline.Measured) // 0.96
	sep := got["e2e serve + worker: runs finished / runs started over the loop"]
	require.False(t, sep.Pass, sep.Measured) // 0.90
	peer := got["e2e runs finished/s vs the peer's (serve + worker vs peer + worker.js)"]
	require.True(t, peer.Pass, peer.Measured) // 900 / 500 runs/s
	require.Contains(t, peer.Measured, "1.80x")
	run := got["e2e start-to-running p50, serve --worker under load"]
	require.True(t, run.Pass, run.Measured)

	x.PgWork = x.PgWork[:1]
	x.E2E = nil
	for _, c := range x.checks() {
		require.False(t, c.Pass, c.Name)
		require.Equal(t, "no data", c.Measured, c.Name)
	}
}

func TestExperimentMarkdown(t *testing.T) {
	t.Parallel()
	x := exampleLog()
	md := x.markdown()
	require.True(t, strings.HasPrefix(md, expHeading+"\n"))
	for _, want := range []string{
		"### PostgreSQL work per run", "| WAL bytes (this database) | 1000 | 1000 | 2000 | 3000 | 2000 | 5000 | 0.40x |",
		"| statements | 2.00 | 1.00 | 3.00 | 5.00 | 4.00 | 9.00 | 0.33x |",
		"### End to end", "| now | serve --worker | 32 | 1000 | 960 | 0.96 | 0.0 | 0.0 | - | 20.0 |", // no client figure: "-"
		"| start-to-final p50 ms | p99 ms | sent-to-final p50 / p99 ms |",
		"| serve --worker | 2.00x | 3.20x |", // now vs baseline, started/s and finished/s
		"### Backlog drain (now)", "| 10 | 1000 | 2.0 | 500 |", "| 50 | FAILED: boom |",
		"0b107b520922",
	} {
		require.Contains(t, md, want)
	}
	require.ErrorContains(t, x.failure(), "drain now at 50")
	x.Drain = nil
	require.NoError(t, x.failure())
	x.E2E[0].Errors = 3
	require.ErrorContains(t, x.failure(), "3 answers were errors")
}

// TestE2ETimesFromTimestamps: start-to-final and start-to-running come from
// the runs' own columns, over the runs created inside the window only;
// runs not final yet are counted apart.
func TestE2ETimesFromTimestamps(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	var org, wf string
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('e2e', 'e2e') RETURNING id`).Scan(&org).Error)
	require.NoError(t, db.Raw(`INSERT INTO workflows (org_id, name) VALUES (?, 'e2e') RETURNING id`, org).Scan(&wf).Error)
	from := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	to := from.Add(10 * time.Second)
	add := func(created time.Time, run, final time.Duration) {
		status, started, finished := "queued", any(nil), any(nil)
		if run >= 0 {
			status, started = "running", created.Add(run)
		}
		if final >= 0 {
			status, finished = "passed", created.Add(final)
		}
		require.NoError(t, db.Exec(`INSERT INTO validation_runs (org_id, workflow_id, submission, status, created_at, started_at, finished_at)
			VALUES (?, ?, '{}', ?, ?, ?, ?)`, org, wf, status, created, started, finished).Error)
	}
	for i := range 100 { // finals of 10, 20, ..., 1000 ms; running after i ms
		add(from.Add(time.Duration(i)*50*time.Millisecond), time.Duration(i)*time.Millisecond, time.Duration(i+1)*10*time.Millisecond)
	}
	add(from.Add(9*time.Second), 5*time.Millisecond, -1) // running, not final
	add(from.Add(9*time.Second), -1, -1)                 // still queued
	add(from.Add(-time.Second), 0, time.Hour)            // created before the window: not counted
	add(to, 0, time.Hour)                                // created at the window's end: not counted

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var r e2eResult
	require.NoError(t, e2eTimes(ctx, conn, from, to, "", &r))
	require.Equal(t, 100, r.Final)
	require.Equal(t, 2, r.Unfinished)
	require.Equal(t, 500*time.Millisecond, r.FinalP50.Round(time.Millisecond))
	require.Equal(t, 990*time.Millisecond, r.FinalP99.Round(time.Millisecond))
	require.True(t, r.HasRunning)
	require.Equal(t, 49*time.Millisecond, r.RunningP50.Round(time.Millisecond)) // 101 started: 0..99 ms and 5 ms
	// The last final run: created at 4.95 s, final after 1 s, so 4.05 s before the window's end.
	require.Zero(t, r.DrainedAfter)
	r.Window, r.Started, r.Finished = 10*time.Second, 200, 150
	require.InDelta(t, 20, r.StartedPerSec(), 1e-9)
	require.InDelta(t, 0.75, r.Ratio(), 1e-9)
	require.Zero(t, e2eResult{}.Ratio())

	// Another organisation's run in the window counts for all, not for org.
	var other string
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('other', 'other') RETURNING id`).Scan(&other).Error)
	require.NoError(t, db.Exec(`INSERT INTO validation_runs (org_id, workflow_id, submission, status, created_at, started_at, finished_at)
		VALUES (?, ?, '{}', 'passed', ?, ?, ?)`, other, wf, from, from, from.Add(time.Hour)).Error)
	var all, mine e2eResult
	require.NoError(t, e2eTimes(ctx, conn, from, to, "", &all))
	require.NoError(t, e2eTimes(ctx, conn, from, to, org, &mine))
	require.Equal(t, 101, all.Final)
	require.Equal(t, 100, mine.Final)
	require.Equal(t, 990*time.Millisecond, mine.FinalP99.Round(time.Millisecond))
	require.NoError(t, waitWindowFinal(ctx, conn, from, to, other, time.Minute), "the other's one run is final: no wait")

	// The finished_at of the runs the 201s named: the final ones only.
	var final, queued string
	require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, submission, status, finished_at)
		VALUES (?, ?, '{}', 'passed', ?) RETURNING id`, org, wf, from).Scan(&final).Error)
	require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, submission) VALUES (?, ?, '{}') RETURNING id`, org, wf).Scan(&queued).Error)
	got, err := finishedAt(ctx, conn, []string{final, queued, "00000000-0000-0000-0000-000000000000"})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.True(t, from.Equal(got[final]), got[final])
}

// TestWaitTimes: the client-felt start to final is each run's finished_at
// minus its request's send time, over the runs final; a run not final is
// counted, never dropped silently.
func TestWaitTimes(t *testing.T) {
	t.Parallel()
	sent := time.Now() // with a monotonic reading, as the load generator's
	var runs []sentRun
	finished := map[string]time.Time{}
	for i := range 100 { // waits of 10, 20, ..., 1000 ms
		id := strconv.Itoa(i)
		runs = append(runs, sentRun{ID: id, Sent: sent.Add(time.Duration(i) * time.Second)})
		finished[id] = sent.Round(0).Add(time.Duration(i)*time.Second + time.Duration(i+1)*10*time.Millisecond)
	}
	runs = append(runs, sentRun{ID: "not final", Sent: sent})
	var r e2eResult
	waitTimes(runs, finished, &r)
	require.Equal(t, 100, r.WaitFinal)
	require.Equal(t, 1, r.WaitUnfinished)
	require.Equal(t, 500*time.Millisecond, r.WaitP50)
	require.Equal(t, 990*time.Millisecond, r.WaitP99)
	require.Equal(t, "500.0 / 990.0", waitCell(&r))

	// None final: counted, and no figure ("-" in the tables).
	var none e2eResult
	waitTimes(runs[100:], finished, &none)
	require.Equal(t, e2eResult{WaitUnfinished: 1}, none)
	require.Equal(t, "-", waitCell(&none))
	require.Equal(t, "1", waitUnfinishedCell(&none))
	require.Equal(t, "-", waitUnfinishedCell(&e2eResult{}))
}

// TestSentRunsObserve: a 201's run id and send time are kept; other answers
// are not, and a 201 naming no run is counted.
func TestSentRunsObserve(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var s sentRuns
	s.observe(answer{Status: http.StatusCreated, Sent: at, Body: []byte(`{"id":"5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a","status":"queued"}`)})
	s.observe(answer{Status: http.StatusOK, Sent: at, Body: []byte(`{"id":"a replay"}`)})
	s.observe(answer{Status: http.StatusCreated, Sent: at, Body: []byte(`{}`)})
	require.Equal(t, []sentRun{{ID: "5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a", Sent: at}}, s.runs)
	require.Equal(t, 1, s.noID)
	require.Equal(t, []string{"5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a"}, s.ids())
}

// TestWalOfCountsThisDatabase: the WAL attributed to a database is its own
// records and their commits, not another database's written meanwhile.
func TestWalOfCountsThisDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, url := testdb.New(t)
	_, otherURL := testdb.New(t)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		msg := "SKIPPING: pg_walinspect is not available (PostgreSQL 15+ with its contrib modules, as a superuser): " + err.Error()
		t.Log(msg)
		t.Skip(msg)
	}
	other, err := pgx.Connect(ctx, otherURL)
	require.NoError(t, err)
	defer other.Close(ctx)
	for _, c := range []*pgx.Conn{conn, other} {
		_, err := c.Exec(ctx, `CREATE TABLE w (id int PRIMARY KEY, v text)`)
		require.NoError(t, err)
	}
	var dbOID uint32
	require.NoError(t, conn.QueryRow(ctx, `SELECT oid FROM pg_database WHERE datname = current_database()`).Scan(&dbOID))
	from, err := walLSN(ctx, conn)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO w SELECT g, 'x' FROM generate_series(1, 10) g`)
	require.NoError(t, err)
	_, err = other.Exec(ctx, `INSERT INTO w SELECT g, 'y' FROM generate_series(1, 25) g`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `UPDATE w SET v = 'z' WHERE id <= 3`)
	require.NoError(t, err)
	to, err := walLSN(ctx, conn)
	require.NoError(t, err)
	wal, err := walOf(ctx, conn, from, to, dbOID)
	require.NoError(t, err)
	p := phaseWork{Runs: 1, WAL: wal}
	require.EqualValues(t, 10, p.heap("INSERT", "INSERT+INIT"), "%v", wal)
	require.EqualValues(t, 3, p.heap("UPDATE", "HOT_UPDATE", "UPDATE+INIT", "HOT_UPDATE+INIT"), "%v", wal)
	require.EqualValues(t, 10, p.indexInserts(), "the other database's 25 are not ours: %v", wal)
	require.EqualValues(t, 2, p.commits(), "%v", wal)
	require.Positive(t, p.walBytes())
}

// TestRedisSnapshotRoundTrip: every drain point starts from the same
// queue: the keys, their values and their expiry come back as they were.
func TestRedisSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	needTool(t, "redis-server")
	ctx := context.Background()
	dir := t.TempDir()
	port := proctest.FreePort(t)
	srv, err := startProc("redis", dir, dir, childEnv(), "redis-server", "--port", strconv.Itoa(port),
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Stop(5 * time.Second) })
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	defer rdb.Close()
	require.Eventually(t, func() bool { return rdb.Ping(ctx).Err() == nil }, 10*time.Second, 20*time.Millisecond)

	require.NoError(t, rdb.HSet(ctx, "asynq:{default}:t:1", "msg", "payload", "state", "pending").Err())
	require.NoError(t, rdb.LPush(ctx, "asynq:{default}:pending", "1", "2", "3").Err())
	require.NoError(t, rdb.Set(ctx, "expiring", "v", time.Hour).Err())
	for i := range 2500 { // more than one pipeline batch
		require.NoError(t, rdb.Set(ctx, "k"+strconv.Itoa(i), i, 0).Err())
	}
	snap, err := dumpRedis(ctx, rdb)
	require.NoError(t, err)
	require.Len(t, snap, 2503)

	require.NoError(t, rdb.FlushDB(ctx).Err())
	require.NoError(t, rdb.Set(ctx, "k1", "changed", 0).Err())
	require.NoError(t, restoreRedis(ctx, rdb, snap))
	require.EqualValues(t, 2503, rdb.DBSize(ctx).Val())
	require.Equal(t, map[string]string{"msg": "payload", "state": "pending"}, rdb.HGetAll(ctx, "asynq:{default}:t:1").Val())
	require.Equal(t, []string{"3", "2", "1"}, rdb.LRange(ctx, "asynq:{default}:pending", 0, -1).Val())
	require.Equal(t, "1", rdb.Get(ctx, "k1").Val())
	ttl := rdb.TTL(ctx, "expiring").Val()
	require.Greater(t, ttl, 59*time.Minute)
	require.Equal(t, time.Duration(-1), rdb.TTL(ctx, "k7").Val(), "no expiry stays none")
}

// TestBuildBaselineRefusesAnUnknownRef: a baseline that is not a commit of
// the repository is an error that names it, before anything is built.
func TestBuildBaselineRefusesAnUnknownRef(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("SKIPPING: git is not installed")
	}
	root, err := os.Getwd()
	require.NoError(t, err)
	if err := exec.Command("git", "-C", root, "rev-parse", "--git-dir").Run(); err != nil {
		t.Skip("SKIPPING: not inside a git repository (a source archive)")
	}
	dir := t.TempDir()
	_, _, err = buildBaseline(context.Background(), root, dir, "no-such-ref-of-valruns")
	require.ErrorContains(t, err, `baseline "no-such-ref-of-valruns" is not a commit`)
	entries, _ := os.ReadDir(dir)
	require.Empty(t, entries, "nothing built")
}

// TestOnlySections: a run of the experiment log (or the noisy neighbour)
// alone replaces its section; a full run writes it at the end of the whole
// results.
func TestOnlySections(t *testing.T) {
	t.Parallel()
	r := &results{Exp: exampleLog()}
	require.True(t, r.onlySections())
	r.Rows = []row{rps("valruns", "start, new key", 900)}
	require.False(t, r.onlySections())
	md := r.markdown()
	require.Contains(t, md, "## Ratios")
	require.Contains(t, md, "\n"+expHeading+"\n")
	require.Greater(t, strings.Index(md, expHeading), strings.Index(md, "## All runs"))
	require.False(t, (&results{}).onlySections(), "nothing measured: nothing to splice")

	// The noisy neighbour likewise, after the experiment log.
	r.Noisy = exampleNoisy()
	md = r.markdown()
	require.Greater(t, strings.Index(md, "\n"+noisyHeading+"\n"), strings.Index(md, expHeading))
	require.True(t, (&results{Noisy: exampleNoisy()}).onlySections())
}
