package main

// The cleanup: N expired keys deleted by `valruns cleanup`, alone (its
// time and the WAL it wrote), then new-key starts at 32 clients while it
// deletes N more, beside the same starts without it.

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// cleanupClients is the load beside the cleanup.
const cleanupClients = 32

type cleanupResult struct {
	Keys       int
	Alone      time.Duration // wall time of `valruns cleanup` with nothing else running
	AloneKeys  int
	AloneWAL   int64 // bytes of WAL written meanwhile (the whole server's)
	Without    row   // new-key starts, expired keys present, no cleanup
	During     row   // the same load while `valruns cleanup` runs
	DuringTime time.Duration
	DuringKeys int
	Failed     string
}

var deletedRe = regexp.MustCompile(`deleted ([0-9]+) expired`)

func (e *env) measureCleanup(ctx context.Context, keys, clients int, t timing) (res cleanupResult) {
	res.Keys = keys
	fail := func(err error) cleanupResult {
		res.Failed = err.Error()
		say("cleanup failed: %v", err)
		return res
	}
	db, err := e.fresh(ctx)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	srv, base, err := e.startServer(ctx, e.dbURL(db), false)
	if err != nil {
		return fail(err)
	}
	defer srv.Stop(20 * time.Second)
	conn, err := e.connect(ctx, db)
	if err != nil {
		return fail(err)
	}
	defer conn.Close(context.Background())
	org, run := e.orgs[0], time.Now().UnixNano()
	proto := fmt.Sprintf("cleanup-proto-%d", run)
	if err := sendOnce(ctx, newHTTPClient(1), base+org.startPath(), []byte(startBody), headerFor(org.Token, proto)); err != nil {
		return fail(err)
	}
	// A real key row copied n times as expired keys, in one statement:
	// every column the server fills, whatever the schema has become.
	insert := func() error {
		tag, err := conn.Exec(ctx, `INSERT INTO idempotency_keys
			SELECT r.* FROM idempotency_keys k, generate_series(1, $1::int) g,
			LATERAL jsonb_populate_record(k, jsonb_build_object(
				'id', gen_random_uuid(), 'key', 'expired-' || g, 'validation_run_id', NULL,
				'created_at', now() - interval '2 days', 'expires_at', now() - interval '1 day')) r
			WHERE k.key = $2`, keys, proto)
		if err == nil && tag.RowsAffected() != int64(keys) {
			err = fmt.Errorf("%d rows, want %d", tag.RowsAffected(), keys)
		}
		if err == nil {
			_, err = conn.Exec(ctx, `VACUUM ANALYZE idempotency_keys`)
		}
		if err != nil {
			return fmt.Errorf("insert expired keys: %w", err)
		}
		return nil
	}
	cleanup := func() (time.Duration, int, error) {
		cmd := exec.CommandContext(ctx, e.bin, "cleanup")
		cmd.Env = childEnv(append([]string{"DATABASE_URL=" + e.dbURL(db)}, e.serverEnv...)...)
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(t0)
		m := deletedRe.FindSubmatch(out)
		if err != nil || m == nil {
			return d, 0, fmt.Errorf("valruns cleanup: %v: %s", err, out)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return d, n, nil
	}
	var lsn0 string
	if err := insert(); err != nil {
		return fail(err)
	}
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn0); err != nil {
		return fail(err)
	}
	if res.Alone, res.AloneKeys, err = cleanup(); err != nil {
		return fail(err)
	}
	if err := conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, lsn0).Scan(&res.AloneWAL); err != nil {
		return fail(err)
	}

	if err := insert(); err != nil {
		return fail(err)
	}
	url := base + org.startPath()
	measure := func(name string, warm, dur time.Duration, stop <-chan struct{}, opened func()) row {
		r := row{Section: "valruns", Scenario: name, Clients: clients}
		m := &usageMeter{pid: srv.Pid()}
		next := func(c, i int) request {
			return request{http.MethodPost, url, headerFor(org.Token, fmt.Sprintf("%s-%d-%d-%d", name, run, c, i)), []byte(startBody)}
		}
		lr := runLoad(ctx, clients, warm, dur, next, nil, stop, func(open bool) {
			m.window(open)
			if open && opened != nil {
				opened()
			}
		})
		r.fill(lr, m)
		return r
	}
	res.Without = measure("new key, no cleanup", t.Warm, t.Dur, nil, nil)
	// The window opens when the cleanup starts and closes when it ends
	// (or after 3 minutes; the cleanup is then still waited for).
	stop, started, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		<-started
		var err error
		res.DuringTime, res.DuringKeys, err = cleanup()
		close(stop)
		done <- err
	}()
	res.During = measure("new key, during cleanup", t.Warm/2, 3*time.Minute, stop, func() { close(started) })
	if err := <-done; err != nil {
		return fail(err)
	}
	say("cleanup: %d keys in %.1f s alone; starts %.0f rps without it, %.0f during", res.AloneKeys, res.Alone.Seconds(), res.Without.RPS, res.During.RPS)
	return res
}

// checks are the cleanup's targets: its speed alone, and what it costs the
// starts (issue 49).
func (c *cleanupResult) checks() []check {
	alone := check{Name: "cleanup of expired keys, alone", Target: ">= 50000 keys/s"}
	rps := check{Name: fmt.Sprintf("new-key starts during the cleanup / without it, %d clients", cleanupClients), Target: ">= 0.95x rps"}
	tail := check{Name: fmt.Sprintf("new-key start p99.9 during the cleanup / without it, %d clients", cleanupClients), Target: "<= 1.5x"}
	if c.Failed != "" || c.Alone <= 0 || c.Without.RPS == 0 || c.Without.P999 == 0 {
		return []check{notMeasured(alone), notMeasured(rps), notMeasured(tail)}
	}
	k := float64(c.AloneKeys) / c.Alone.Seconds()
	alone.Measured, alone.Pass = fmt.Sprintf("%.0f keys/s (%d keys in %.2f s)", k, c.AloneKeys, c.Alone.Seconds()), k >= 50000
	f := c.During.RPS / c.Without.RPS
	rps.Measured, rps.Pass = fmt.Sprintf("%sx (%.0f / %.0f rps)", ratioText(f, 0.95), c.During.RPS, c.Without.RPS), f >= 0.95
	f = float64(c.During.P999) / float64(c.Without.P999)
	tail.Measured, tail.Pass = fmt.Sprintf("%sx (%s / %s ms)", ratioText(f, 1.5), ms(c.During.P999), ms(c.Without.P999)), f <= 1.5
	return []check{alone, rps, tail}
}

func (c *cleanupResult) section() section {
	s := section{Heading: "## Cleanup", Checks: c.checks()}
	if c.Failed != "" {
		s.Body = "FAILED: " + short(c.Failed, 400) + "\n"
		return s
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d expired keys (copies of a key row the server wrote), deleted by `valruns cleanup` alone: %d keys in %.2f s, "+
		"%.1f MB of WAL (`pg_current_wal_lsn()` before and after: the whole server's). Then as many again while new-key starts arrive from %d clients: "+
		"%d keys in %.2f s; the window of the starts \"during\" is the cleanup's.\n\n",
		c.Keys, c.AloneKeys, c.Alone.Seconds(), float64(c.AloneWAL)/(1<<20), cleanupClients, c.DuringKeys, c.DuringTime.Seconds())
	b.WriteString(checkTable(s.Checks))
	b.WriteString("\n| starts | clients | rps | p50 ms | p99 ms | p99.9 ms | errors | non-2xx | CPU ms/req |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range []row{c.Without, c.During} {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %s | %d | %d | %s |\n", x.Scenario, x.Clients, x.RPS,
			ms(x.P50), ms(x.P99), ms(x.P999), x.Errors, x.Non2xx, ms3(x.CPUPerReq))
	}
	s.Body = b.String()
	return s
}
