package main

// The database's limit: pgbench running a start's statements, written by
// hand in tools/bench/sql/ (the peer's one INSERT, valruns' start
// statements as the server sends them), at the same client counts as the
// HTTP runs, with -M prepared as the drivers' statement caches do.

import (
	"cmp"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

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

var (
	tpsRe    = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)
	failedRe = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
)

// pgbench runs the script on database db with clients connections, the
// bench organisation's ids as its variables: its tps and failed
// transactions, or PostgreSQL's errors when it was aborted.
func (e *env) pgbench(ctx context.Context, db, script string, clients int, args ...string) (tps float64, failed int, err error) {
	o := e.orgs[0]
	a := []string{"-n", "-M", "prepared", "-f", filepath.Join(e.root, script),
		"-D", "org=" + o.ID, "-D", "wf=" + o.Workflow, "-D", "token=" + o.TokenID, "-D", "quota=" + strconv.FormatInt(o.Quota, 10),
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(max(1, min(clients, runtime.NumCPU())))}
	// The database's URL in place of its name: libpq reads it whole.
	out, err := exec.CommandContext(ctx, "pgbench", append(append(a, args...), e.dbURL(db))...).CombinedOutput()
	tps, failed, aborted := parsePgbench(string(out))
	if err != nil || aborted {
		err = fmt.Errorf("pgbench %s: %s", script, pgbenchErrors(string(out)))
	}
	return tps, failed, err
}

// parsePgbench reads pgbench's summary.
func parsePgbench(out string) (tps float64, failed int, aborted bool) {
	if m := tpsRe.FindStringSubmatch(out); m != nil {
		tps, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := failedRe.FindStringSubmatch(out); m != nil {
		failed, _ = strconv.Atoi(m[1])
	}
	return tps, failed, strings.Contains(out, "aborted")
}

// checkScript runs the script on database db for a few transactions and
// fails when PostgreSQL refuses it, or when they did not each write a run
// (valruns' start gone to its slow path writes nothing).
func (e *env) checkScript(ctx context.Context, conn *pgx.Conn, db string, s sqlScript) error {
	var before, after int
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs`).Scan(&before)
	if _, failed, err := e.pgbench(ctx, db, s.Path, 2, "-t", "5"); err != nil || failed > 0 {
		return cmp.Or(err, fmt.Errorf("pgbench %s: %d transactions failed", s.Path, failed))
	}
	_ = conn.QueryRow(ctx, `SELECT count(*) FROM validation_runs`).Scan(&after)
	if after-before != 10 {
		return fmt.Errorf("%s: 10 transactions wrote %d runs, want 10", s.Path, after-before)
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
	r.Failed = failed(fmt.Sprintf("pgbench %s c=%d", s.Path, clients), e.onRig(ctx, nil, nil, func(rg *rig, _ []*proc) (err error) {
		if err := e.checkScript(ctx, rg.conn, rg.db, s); err != nil {
			return err
		}
		c := min(clients, e.availableConns(ctx))
		// With more of one organisation's transactions in flight than its
		// usage slots, the server's start would wait for a slot (its slow
		// path); the script's goes slow and writes nothing.
		if s.Slots {
			c = min(c, models.UsageSlots)
		}
		if c != clients {
			r.CappedAt = c
		}
		secs := func(d time.Duration) string { return strconv.Itoa(max(1, int(d.Round(time.Second).Seconds()))) }
		_, _, _ = e.pgbench(ctx, rg.db, s.Path, c, "-T", secs(t.Warm))
		r.RPS, r.Errors, err = e.pgbench(ctx, rg.db, s.Path, c, "-T", secs(t.Dur))
		return err
	}))
	return r
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
