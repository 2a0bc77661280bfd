package main

// The cleanup: N expired keys deleted by `valruns cleanup` alone (its time and
// WAL), then N more beside new-key starts at 32 clients, and those starts alone.

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// cleanupClients is the load beside the cleanup.
const cleanupClients = 32

type cleanupResult struct {
	Keys, AloneKeys, DuringKeys int           // expired keys made, and deleted alone and beside the starts
	Alone, DuringTime           time.Duration // the cleanup's wall time, alone and beside the starts
	AloneWAL                    int64         // bytes of WAL written meanwhile (the whole server's)
	Without, During             row           // new-key starts, expired keys present, without and during a cleanup
	Failed                      string
}

var deletedRe = regexp.MustCompile(`deleted ([0-9]+) expired`)

func (e *env) measureCleanup(ctx context.Context, keys int, t timing) *cleanupResult {
	c := &cleanupResult{Keys: keys}
	c.Failed = failed("cleanup", e.onRig(ctx, []string{"serve"}, nil, func(rg *rig, ps []*proc) (err error) {
		org, proto, srv := e.orgs[0], "cleanup-proto", ps[0] // the rig's database is fresh
		if _, err := post(ctx, rg.base+org.startPath(), []byte(startBody), headerFor(org.Token, proto)); err != nil {
			return err
		}
		if err := insertExpired(ctx, rg.conn, c.Keys, proto); err != nil {
			return err
		}
		if c.Alone, c.AloneKeys, c.AloneWAL, err = e.runCleanup(ctx, rg, make(chan struct{})); err != nil {
			return err
		}
		if err := insertExpired(ctx, rg.conn, c.Keys, proto); err != nil {
			return err
		}
		starts := func(name string, warm, dur time.Duration, stop, open <-chan struct{}) row {
			r, m := row{Section: "valruns", Scenario: name, Clients: cleanupClients}, &usageMeter{pid: srv.cmd.Process.Pid}
			r.fill(runLoad(ctx, cleanupClients, warm, dur, newKeys(rg.base, org, org.Token), loadOptions{Stop: stop, Open: open, OnWindow: m.window}), m)
			return r
		}
		c.Without = starts("new key, no cleanup", t.Warm, t.Dur, nil, nil)
		// The window: from the cleanup's start (runCleanup) to its end, or 3 minutes at most.
		stop, begun, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		go func() {
			time.Sleep(t.Warm / 2) // the load's warm-up
			var err error
			c.DuringTime, c.DuringKeys, _, err = e.runCleanup(ctx, rg, begun)
			close(stop)
			done <- err
		}()
		c.During = starts("new key, during cleanup", t.Warm/2, 3*time.Minute, stop, begun)
		say("cleanup: %d keys in %.1f s alone; starts %.0f rps without it, %.0f during", c.AloneKeys, c.Alone.Seconds(), c.Without.RPS, c.During.RPS)
		return <-done
	}))
	return c
}

// insertExpired copies the key row proto n times as expired keys: every
// column the server fills, whatever the schema has become.
func insertExpired(ctx context.Context, conn *pgx.Conn, n int, proto string) error {
	// Yesterday's partition of the keys (migration 0012): the cleanup
	// dropped the last one.
	if _, err := conn.Exec(ctx, `SELECT idempotency_key_partitions(now() - interval '1 day', now() - interval '1 day')`); err != nil {
		return err
	}
	tag, err := conn.Exec(ctx, `INSERT INTO idempotency_keys
		SELECT r.* FROM idempotency_keys k, generate_series(1, $1::int) g,
		LATERAL jsonb_populate_record(k, jsonb_build_object(
			'id', gen_random_uuid(), 'key', 'expired-' || g, 'validation_run_id', NULL,
			'created_at', now() - interval '2 days', 'expires_at', now() - interval '1 day')) r
		WHERE k.key = $2`, n, proto)
	if err == nil && tag.RowsAffected() != int64(n) {
		err = fmt.Errorf("%d rows, want %d", tag.RowsAffected(), n)
	}
	if err == nil {
		_, err = conn.Exec(ctx, `VACUUM ANALYZE idempotency_keys`)
	}
	return err
}

// runCleanup runs `valruns cleanup` on the rig: its time, keys deleted, WAL
// written. Its time runs from its log's "cleanup started", once connected
// (the worker's scheduled cleanup runs in a process already up), when
// begun is closed.
func (e *env) runCleanup(ctx context.Context, rg *rig, begun chan struct{}) (d time.Duration, n int, wal int64, err error) {
	var lsn string
	if err = rg.conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return
	}
	cmd := exec.CommandContext(ctx, e.bin, "cleanup")
	cmd.Env = childEnv(append([]string{"DATABASE_URL=" + e.dbURL(rg.db)}, e.serverEnv...)...)
	var out, logged strings.Builder
	cmd.Stdout = &out
	logs, err := cmd.StderrPipe()
	if err == nil {
		err = cmd.Start()
	}
	var t0 time.Time
	for sc := bufio.NewScanner(logs); err == nil && sc.Scan(); {
		if logged.WriteString(sc.Text() + "\n"); t0.IsZero() && strings.Contains(sc.Text(), "cleanup started") {
			t0 = time.Now()
			close(begun)
		}
	}
	if err == nil {
		err = cmd.Wait()
	}
	d = time.Since(t0)
	m := deletedRe.FindStringSubmatch(out.String())
	if err != nil || m == nil || t0.IsZero() {
		return d, 0, 0, fmt.Errorf("valruns cleanup (no \"cleanup started\" logged?): %v: %s%s", err, out.String(), logged.String())
	}
	n, _ = strconv.Atoi(m[1])
	err = rg.conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, lsn).Scan(&wal)
	return
}

// checks are the cleanup's targets (issue 49): its speed alone, its cost to starts.
func (c *cleanupResult) checks() []check {
	ok, of, without := c.Failed == "" && c.Alone > 0, fmt.Sprintf(" of %d keys", c.Keys), " / without it, "+clientsText(cleanupClients)
	k := float64(c.AloneKeys) / c.Alone.Seconds()
	alone := check{Name: "cleanup" + of + ", alone", Target: ">= 50000 keys/s", Pass: k >= 50000,
		Measured: fmt.Sprintf("%.0f keys/s (%d keys in %.2f s)", k, c.AloneKeys, c.Alone.Seconds())}
	if !ok {
		alone = notMeasured(alone)
	}
	return []check{alone,
		ratio(check{Name: "new-key starts during the cleanup" + of + without, Target: ">= 0.95x rps"}, ok, c.During.RPS, c.Without.RPS, 0.95, false,
			fmt.Sprintf("%.0f / %.0f rps", c.During.RPS, c.Without.RPS)),
		ratio(check{Name: "new-key start p99.9 during the cleanup" + of + without, Target: "<= 1.5x"}, ok, float64(c.During.P999), float64(c.Without.P999), 1.5, true,
			fmt.Sprintf("%s / %s ms", ms(c.During.P999), ms(c.Without.P999))),
	}
}

// cleanups are the cleanup's measurements, one per count of keys.
type cleanups []*cleanupResult

func (cs cleanups) section() section {
	s, b := section{Heading: "## Cleanup", Intro: fmt.Sprintf("Expired keys (copies of a key row the server wrote) deleted by `valruns cleanup` alone (its time, the WAL the whole "+
		"server wrote meanwhile), then as many again while new-key starts arrive from %d clients. Its time and the window \"during\" run from its log's \"cleanup started\", once connected, to its end.", cleanupClients)}, &strings.Builder{}
	b.WriteString("| keys | deleted alone: keys in s, WAL MB | beside the starts: keys in s | starts | rps | p50 ms | p99 ms | p99.9 ms | errors | non-2xx | CPU ms/req |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range cs {
		s.Checks = append(s.Checks, c.checks()...)
		if c.Failed != "" {
			fmt.Fprintf(b, "| %d | FAILED: %s | | | | | | | | | |\n", c.Keys, cell(short(c.Failed, 300)))
			continue
		}
		for _, x := range []row{c.Without, c.During} {
			fmt.Fprintf(b, "| %d | %d in %.2f, %.1f | %d in %.2f | %s | %.0f | %s | %s | %s | %d | %d | %s |\n", c.Keys, c.AloneKeys, c.Alone.Seconds(),
				float64(c.AloneWAL)/(1<<20), c.DuringKeys, c.DuringTime.Seconds(), x.Scenario, x.RPS, ms(x.P50), ms(x.P99), ms(x.P999), x.Errors, x.Non2xx, ms3(x.CPUPerReq))
		}
	}
	if few, most := cs[0], cs[len(cs)-1]; len(cs) > 1 { // the cleanup's own time, from the fewest keys to the most
		s.Checks = append(s.Checks, ratio(check{Name: fmt.Sprintf("cleanup time alone, %d keys / %d", most.Keys, few.Keys), Target: "<= 2x"}, few.Failed == "" && most.Failed == "",
			most.Alone.Seconds(), few.Alone.Seconds(), 2, true, fmt.Sprintf("%.2f / %.2f s", most.Alone.Seconds(), few.Alone.Seconds())))
	}
	s.Body = b.String()
	return s
}
