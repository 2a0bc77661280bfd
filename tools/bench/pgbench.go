package main

// The database's limit: pgbench running a start's statements, written by
// hand in tools/bench/sql/ (the peer's one INSERT, valruns' start
// statements as the server sends them), at the same client counts as the
// HTTP runs, with -M prepared as the drivers' statement caches do.

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valruns/valruns/models"
)

// sqlScript is a hand-written pgbench script and the scenario of its rows.
type sqlScript struct {
	Scenario string
	Path     string // from the repository's root
	// Slots: the script is valruns' start, which claims one of the
	// organisation's usage slots with SKIP LOCKED.
	Slots bool
}

const (
	pgbenchPeerScenario  = "the peer's INSERT"
	pgbenchStartScenario = "valruns' start statements"
	peerScript           = "tools/bench/sql/peer_insert.sql"
	startScript          = "tools/bench/sql/valruns_start.sql"
)

var (
	peerSQL  = sqlScript{Scenario: pgbenchPeerScenario, Path: peerScript}
	startSQL = sqlScript{Scenario: pgbenchStartScenario, Path: startScript, Slots: true}
)

// pgbenchResult is one pgbench run's summary.
type pgbenchResult struct {
	TPS     float64
	Latency time.Duration // average
	Done    int
	Failed  int
	Aborted bool
	Output  string
}

var (
	tpsRe     = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)
	latRe     = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
	doneRe    = regexp.MustCompile(`(?m)^number of transactions actually processed: ([0-9]+)`)
	failedRe  = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
	abortedRe = regexp.MustCompile(`(?m)aborted|Run was aborted`)
)

// parsePgbench reads pgbench's summary.
func parsePgbench(out string) pgbenchResult {
	r := pgbenchResult{Output: out, Aborted: abortedRe.MatchString(out)}
	if m := tpsRe.FindStringSubmatch(out); m != nil {
		r.TPS, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := latRe.FindStringSubmatch(out); m != nil {
		f, _ := strconv.ParseFloat(m[1], 64)
		r.Latency = time.Duration(f * float64(time.Millisecond))
	}
	if m := doneRe.FindStringSubmatch(out); m != nil {
		r.Done, _ = strconv.Atoi(m[1])
	}
	if m := failedRe.FindStringSubmatch(out); m != nil {
		r.Failed, _ = strconv.Atoi(m[1])
	}
	return r
}

// pgbench runs the script on database db with clients connections, the
// bench organisation's ids as its variables.
func (e *env) pgbench(ctx context.Context, db, script string, clients int, args ...string) pgbenchResult {
	o := e.orgs[0]
	a := []string{"-n", "-M", "prepared", "-f", filepath.Join(e.root, script),
		"-D", "org=" + o.ID, "-D", "wf=" + o.Workflow, "-D", "token=" + o.TokenID, "-D", "quota=" + strconv.FormatInt(o.Quota, 10),
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(max(1, min(clients, runtime.NumCPU()))),
		"-h", e.pg.Host, "-p", strconv.Itoa(int(e.pg.Port)), "-U", e.pg.User}
	a = append(append(a, args...), db)
	cmd := exec.CommandContext(ctx, "pgbench", a...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+e.pg.Password, "PGSSLMODE="+cmp.Or(e.baseURL.Query().Get("sslmode"), "prefer"))
	out, err := cmd.CombinedOutput()
	r := parsePgbench(string(out))
	r.Aborted = r.Aborted || err != nil
	return r
}

// checkScript runs the script on database db for a few transactions and
// fails when PostgreSQL refuses it, or when they did not each write a run
// (valruns' start gone to its slow path writes nothing).
func (e *env) checkScript(ctx context.Context, db string, s sqlScript) error {
	conn, err := e.connect(ctx, db)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	runs := func() (n int) {
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs`).Scan(&n)
		return n
	}
	before := runs()
	res := e.pgbench(ctx, db, s.Path, 2, "-t", "5")
	if res.Aborted || res.Done != 10 || res.Failed > 0 {
		return fmt.Errorf("pgbench could not run %s: %s", s.Path, pgbenchErrors(res.Output))
	}
	if n := runs() - before; n != 10 {
		return fmt.Errorf("%s: 10 transactions wrote %d runs, want 10", s.Path, n)
	}
	return nil
}

// availableConns is how many more connections the server accepts now,
// keeping a margin for everyone else.
func (e *env) availableConns(ctx context.Context) int {
	var maxc, reserved, used int
	err := e.admin.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int, (SELECT count(*) FROM pg_stat_activity)`).Scan(&maxc, &reserved, &used)
	if err != nil {
		return 1 << 20
	}
	return max(1, maxc-reserved-used-10)
}

// runPgbench measures the script at one concurrency on a fresh database,
// after checking it there.
func (e *env) runPgbench(ctx context.Context, s sqlScript, clients int, t timing) row {
	r := row{Section: "pgbench", Scenario: s.Scenario, Clients: clients}
	fail := func(err error) row {
		r.Failed = err.Error()
		return r
	}
	db, err := e.fresh(ctx)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	if err := e.checkScript(ctx, db, s); err != nil {
		return fail(err)
	}
	c := min(clients, e.availableConns(ctx))
	// With more of one organisation's transactions in flight than its usage
	// slots, the server's start would wait for a slot (its slow path); the
	// script's goes slow and writes nothing.
	if s.Slots {
		c = min(c, models.UsageSlots)
	}
	if c != clients {
		r.CappedAt = c
	}
	secs := func(d time.Duration) string { return strconv.Itoa(max(1, int(d.Round(time.Second).Seconds()))) }
	_ = e.pgbench(ctx, db, s.Path, c, "-T", secs(t.Warm))
	logDir, err := os.MkdirTemp("", "valruns-pgbench-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(logDir)
	res := e.pgbench(ctx, db, s.Path, c, "-T", secs(t.Dur), "-l", "--log-prefix", filepath.Join(logDir, "tx"))
	r.RPS, r.Errors = res.TPS, res.Failed
	if lat, err := readTxLogs(logDir); err == nil && len(lat) > 0 {
		r.P50, r.P99, r.P999 = percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 0.999)
	} else {
		r.P50 = res.Latency
		r.Notes = append(r.Notes, "latency is pgbench's average (p50 column)")
	}
	if res.Aborted || res.TPS == 0 {
		r.Failed = "pgbench: " + short(pgbenchErrors(res.Output), 400)
	}
	return r
}

// readTxLogs reads the transaction latencies of pgbench's -l logs (third
// field: microseconds), sorted.
func readTxLogs(dir string) ([]time.Duration, error) {
	files, err := filepath.Glob(filepath.Join(dir, "tx*"))
	if err != nil {
		return nil, err
	}
	var lat []time.Duration
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if fs := strings.Fields(line); len(fs) >= 3 {
				if us, err := strconv.ParseInt(fs[2], 10, 64); err == nil {
					lat = append(lat, time.Duration(us)*time.Microsecond)
				}
			}
		}
	}
	slices.Sort(lat)
	return lat, nil
}

// pgbenchErrors is the first error lines of pgbench's output (or its last
// lines when it printed no error).
func pgbenchErrors(s string) string {
	var errs []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "error:") && len(errs) < 3 {
			errs = append(errs, strings.TrimSpace(l))
		}
	}
	if len(errs) == 0 {
		lines := strings.Split(strings.TrimSpace(s), "\n")
		errs = lines[max(0, len(lines)-4):]
	}
	return strings.Join(errs, " | ")
}
