package main

// The cleanup measurement: N expired keys deleted by `valruns cleanup`,
// alone (keys/s) and while new-key starts arrive (their p99 beside the p99
// of the same load without a cleanup).

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

type cleanupResult struct {
	Keys         int
	InsertTime   time.Duration
	Alone        time.Duration // wall time of `valruns cleanup` with nothing else running
	AloneDeleted int
	Baseline     row // new-key starts, 32 clients, expired keys present, no cleanup
	During       row // the same load while `valruns cleanup` runs
	DuringTime   time.Duration
	DuringKeys   int
	Failed       string
}

// KeysPerSec is the deletion rate of the cleanup alone.
func (c cleanupResult) KeysPerSec() float64 {
	if c.Alone <= 0 {
		return 0
	}
	return float64(c.AloneDeleted) / c.Alone.Seconds()
}

var deletedRe = regexp.MustCompile(`deleted ([0-9]+) expired`)

// insertExpired copies a real key row (written by the server) n times as
// expired keys, in one statement. Copying the row keeps every column the
// server fills, whatever the schema has become; only the identity, the
// key, the run link and the times are replaced.
func (e *env) insertExpired(ctx context.Context, db, protoKey string, n int) (time.Duration, error) {
	conn, err := e.connect(ctx, db)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	t0 := time.Now()
	tag, err := conn.Exec(ctx, `
INSERT INTO idempotency_keys
SELECT r.* FROM idempotency_keys k, generate_series(1, $1::int) g,
LATERAL jsonb_populate_record(k, jsonb_build_object(
	'id', gen_random_uuid(), 'key', 'expired-' || g, 'validation_run_id', NULL,
	'created_at', now() - interval '2 days', 'expires_at', now() - interval '1 day')) r
WHERE k.key = $2`, n, protoKey)
	if err != nil {
		return 0, fmt.Errorf("insert expired keys: %w", err)
	}
	if tag.RowsAffected() != int64(n) {
		return 0, fmt.Errorf("insert expired keys: %d rows, want %d", tag.RowsAffected(), n)
	}
	d := time.Since(t0)
	if _, err := conn.Exec(ctx, `VACUUM ANALYZE idempotency_keys`); err != nil {
		return d, err
	}
	return d, nil
}

// runCleanupCmd runs `valruns cleanup` on db and returns its wall time and count.
func (e *env) runCleanupCmd(ctx context.Context, db string) (*exec.Cmd, func() (time.Duration, int, error)) {
	cmd := exec.CommandContext(ctx, e.bin, "cleanup")
	cmd.Env = childEnv(append([]string{"DATABASE_URL=" + e.dbURL(db)}, e.serverEnv...)...)
	var out []byte
	var err error
	t0 := time.Now()
	done := make(chan struct{})
	go func() {
		out, err = cmd.CombinedOutput()
		close(done)
	}()
	return cmd, func() (time.Duration, int, error) {
		<-done
		d := time.Since(t0)
		if err != nil {
			return d, 0, fmt.Errorf("valruns cleanup: %v: %s", err, out)
		}
		m := deletedRe.FindSubmatch(out)
		if m == nil {
			return d, 0, fmt.Errorf("valruns cleanup printed no count: %s", out)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return d, n, nil
	}
}

func (e *env) measureCleanup(ctx context.Context, keys, clients int, t timing) (res cleanupResult) {
	res.Keys = keys
	fail := func(err error) cleanupResult {
		res.Failed = err.Error()
		return res
	}
	db, err := e.fresh(ctx)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	srv, base, err := e.startServer(ctx, db, false)
	if err != nil {
		return fail(err)
	}
	defer srv.Stop(20 * time.Second)
	hc := newHTTPClient(1)
	proto := fmt.Sprintf("cleanup-proto-%d", time.Now().UnixNano())
	if err := sendOnce(ctx, hc, base+e.orgs[0].startPath(), []byte(startBody), headerFor(e.orgs[0].Token, proto)); err != nil {
		return fail(err)
	}

	// Alone.
	if res.InsertTime, err = e.insertExpired(ctx, db, proto, keys); err != nil {
		return fail(err)
	}
	_, wait := e.runCleanupCmd(ctx, db)
	if res.Alone, res.AloneDeleted, err = wait(); err != nil {
		return fail(err)
	}

	// Under load: the same number of keys again, then the starts without
	// and with a cleanup running.
	if _, err = e.insertExpired(ctx, db, proto, keys); err != nil {
		return fail(err)
	}
	url := base + e.orgs[0].startPath()
	run := time.Now().UnixNano()
	next := func(tag string) requestFunc {
		return func(c, i int) request {
			return request{http.MethodPost, url, headerFor(e.orgs[0].Token, fmt.Sprintf("%s-%d-%d-%d", tag, run, c, i)), []byte(startBody)}
		}
	}
	measure := func(name, tag string, warm, dur time.Duration) row {
		r := row{Section: "valruns", Scenario: name, Clients: clients}
		m := &usageMeter{pid: srv.Pid()}
		lr := runLoad(ctx, clients, warm, dur, next(tag), nil, nil, func(open bool) {
			if open {
				m.open()
			} else {
				m.close()
			}
		})
		r.fillServer(lr, m)
		return r
	}
	res.Baseline = measure("new key, expired keys present, no cleanup", "base", t.Warm, t.Dur)

	stop := make(chan struct{})
	var cleanupErr error
	started := make(chan struct{})
	go func() {
		<-started
		_, wait := e.runCleanupCmd(ctx, db)
		res.DuringTime, res.DuringKeys, cleanupErr = wait()
		close(stop)
	}()
	// The window opens when the cleanup starts and closes when it ends
	// (or after 3 minutes; the cleanup is then still waited for).
	res.During = func() row {
		r := row{Section: "valruns", Scenario: "new key, during cleanup", Clients: clients}
		m := &usageMeter{pid: srv.Pid()}
		lr := runLoad(ctx, clients, t.Warm/2, 3*time.Minute, next("during"), nil, stop, func(open bool) {
			if open {
				m.open()
				close(started)
			} else {
				m.close()
			}
		})
		r.fillServer(lr, m)
		return r
	}()
	<-stop
	if cleanupErr != nil {
		return fail(cleanupErr)
	}
	return res
}
