package main

// The database limit: the captured new-key start replayed by pgbench, so
// the table shows how far the service is from what its own SQL allows.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/valruns/valruns/models"
)

func readAll(resp *http.Response) []byte {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

// captured is the result of the capture step.
type captured struct {
	A      requestCapture // the new-key start all statements are shown from
	Script *pgbenchScript
	Path   string // where the script was written
	Err    error
}

// captureStart runs valruns serve behind the capture proxy and records
// new-key starts: two on the first organisation, one on each other
// organisation, each after a warm-up request (auth cache, statement cache).
func (e *env) captureStart(ctx context.Context, outDir string) captured {
	serve := func(ctx context.Context, dbURL string) (*proc, string, error) {
		return e.startServer(ctx, dbURL, false)
	}
	return e.captureSQL(ctx, filepath.Join(outDir, "pgbench-start.sql"), serve, e.orgs)
}

// capturePeer records the peer's new-key starts the same way: its one
// organisation, twice.
func (e *env) capturePeer(ctx context.Context, outDir string) captured {
	peer := func(ctx context.Context, dbURL string) (*proc, string, error) {
		return e.startPeer(ctx, dbURL, false)
	}
	return e.captureSQL(ctx, filepath.Join(outDir, "pgbench-peer.sql"), peer, e.orgs[:1])
}

// captureSQL starts a server with start on a fresh database reached through
// the capture proxy, records new-key starts of orgs and writes the pgbench
// script made from them to path.
func (e *env) captureSQL(ctx context.Context, path string, start func(ctx context.Context, dbURL string) (*proc, string, error), orgs []benchOrg) captured {
	var cp captured
	db, err := e.fresh(ctx)
	if err != nil {
		cp.Err = err
		return cp
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	host, port := e.pg.Host, e.pg.Port
	if strings.HasPrefix(host, "/") {
		cp.Err = fmt.Errorf("DATABASE_URL uses a Unix socket (%s): the capture proxy needs TCP", host)
		return cp
	}
	c, err := newCapture(fmt.Sprintf("%s:%d", host, port))
	if err != nil {
		cp.Err = err
		return cp
	}
	defer c.Close()
	u := *e.baseURL
	u.Host = c.Addr().String()
	u.Path = "/" + db
	q := u.Query()
	q.Set("sslmode", "disable") // the proxy reads the protocol: no TLS between the server and it
	u.RawQuery = q.Encode()

	srv, base, err := start(ctx, u.String())
	if err != nil {
		cp.Err = err
		return cp
	}
	defer srv.Stop(10 * time.Second)
	hc := &http.Client{Timeout: 30 * time.Second}
	send := func(o benchOrg) error {
		h := headerFor(o.Token, uuid.NewString())
		h.Set("X-Request-Id", uuid.NewString())
		return sendOnce(ctx, hc, base+o.startPath(), []byte(startBody), h)
	}
	one := func(o benchOrg, warm int) (requestCapture, error) {
		for range warm {
			if err := send(o); err != nil {
				return requestCapture{}, err
			}
		}
		from := c.Mark()
		if err := send(o); err != nil {
			return requestCapture{}, err
		}
		rc := summarize(c.Window(from, c.Mark()))
		if len(rc.Errors) > 0 {
			return rc, fmt.Errorf("the database answered errors during a captured start: %s", strings.Join(rc.Errors, "; "))
		}
		if len(rc.Stmts) == 0 {
			return rc, errors.New("no statement captured (does the server reach the database through the proxy?)")
		}
		return rc, nil
	}
	if cp.A, err = one(orgs[0], 3); err != nil {
		cp.Err = err
		return cp
	}
	b, err := one(orgs[0], 0)
	if err != nil {
		cp.Err = err
		return cp
	}
	var others []requestCapture
	for _, o := range orgs[1:] {
		rc, err := one(o, 1)
		if err != nil {
			cp.Err = err
			return cp
		}
		others = append(others, rc)
	}
	names, err := e.typeNames(ctx, db, cp.A)
	if err != nil {
		cp.Err = err
		return cp
	}
	if cp.Script, err = buildScript(cp.A, b, others, names); err != nil {
		cp.Err = err
		return cp
	}
	cp.Path = path
	cp.Err = os.WriteFile(cp.Path, []byte(cp.Script.Text), 0o644)
	return cp
}

// typeNames names the parameter types of the captured statements.
func (e *env) typeNames(ctx context.Context, db string, rc requestCapture) (map[uint32]string, error) {
	conn, err := e.connect(ctx, db)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	return typeNames(ctx, conn, rc)
}

// typeNames asks PostgreSQL for the names of the parameter types of rc.
func typeNames(ctx context.Context, conn *pgx.Conn, rc requestCapture) (map[uint32]string, error) {
	var oids []uint32
	for _, s := range rc.Stmts {
		for _, p := range s.Params {
			if p.OID != 0 {
				oids = append(oids, p.OID)
			}
		}
	}
	rows, err := conn.Query(ctx, `SELECT oid::int8, format_type(oid, NULL) FROM pg_type WHERE oid = ANY($1::oid[])`, oids)
	if err != nil {
		return nil, err
	}
	m := map[uint32]string{}
	for rows.Next() {
		var oid int64
		var name string
		if err := rows.Scan(&oid, &name); err != nil {
			return nil, err
		}
		m[uint32(oid)] = name
	}
	return m, rows.Err()
}

// pgbenchResult is one pgbench run.
type pgbenchResult struct {
	TPS      float64
	Latency  time.Duration // average
	Done     int
	Failed   int
	Aborted  bool
	Output   string
	Clients  int
	Capped   bool
	Duration time.Duration
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
	r := pgbenchResult{Output: out}
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
	r.Aborted = abortedRe.MatchString(out)
	return r
}

// pgbench runs the script on database db.
func (e *env) pgbench(ctx context.Context, db, script string, norgs, clients int, args ...string) pgbenchResult {
	a := []string{"-n", "-M", "prepared", "-f", script, "-D", fmt.Sprintf("norgs=%d", norgs),
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(max(1, min(clients, runtime.NumCPU()))),
		"-h", e.pg.Host, "-p", strconv.Itoa(int(e.pg.Port)), "-U", e.pg.User}
	a = append(a, args...)
	a = append(a, db)
	cmd := exec.CommandContext(ctx, "pgbench", a...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+e.pg.Password, "PGSSLMODE="+cmp.Or(e.baseURL.Query().Get("sslmode"), "prefer"))
	out, err := cmd.CombinedOutput()
	r := parsePgbench(string(out))
	r.Clients = clients
	if err != nil {
		r.Aborted = true
	}
	return r
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

// The scenarios of pgbench's rows, and their scripts.
const (
	pgbenchPeerScenario  = "the peer's start SQL, 1 org"
	pgbenchStartScenario = "new-key start SQL, 1 org"
	peerScript           = "tools/bench/results/pgbench-peer.sql"
	startScript          = "tools/bench/results/pgbench-start.sql"
)

// sqlScript is a captured start to replay with pgbench.
type sqlScript struct {
	Scenario string // its rows' scenario
	Path     string // "" when its capture failed
	// UsageSlots: the script is valruns' start, whose captured fast path
	// claims one of an organisation's usage slots.
	UsageSlots bool
}

// runPgbench measures the script at one concurrency on a fresh database.
func (e *env) runPgbench(ctx context.Context, sc sqlScript, clients int, t timing) row {
	norgs := 1
	r := row{Section: "pgbench", Scenario: sc.Scenario, Clients: clients}
	if sc.Path == "" {
		r.Failed = "no script: the capture failed"
		return r
	}
	script := sc.Path
	db, err := e.fresh(ctx)
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	c := clients
	if avail := e.availableConns(ctx); c > avail {
		c = avail
		r.Notes = append(r.Notes, fmt.Sprintf("clients capped at %d by the server's max_connections", c))
	}
	// The captured statement is the start's fast path: it claims one of an
	// organisation's usage slots with SKIP LOCKED. With more transactions of
	// one organisation in flight than slots, the server takes its slow path
	// (it waits for a slot), which the script does not replay.
	if perOrg := (c + norgs - 1) / norgs; sc.UsageSlots && perOrg > models.UsageSlots {
		c = models.UsageSlots * norgs
		r.Notes = append(r.Notes, fmt.Sprintf("clients capped at %d: the captured fast path claims one of the %d usage slots per organisation", c, models.UsageSlots))
	}
	if c != clients {
		r.CappedAt = c
	}
	if t.Warm > 0 {
		_ = e.pgbench(ctx, db, script, norgs, c, "-T", strconv.Itoa(max(1, int(t.Warm.Round(time.Second).Seconds()))))
	}
	logDir, err := os.MkdirTemp("", "valruns-pgbench-")
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	defer os.RemoveAll(logDir)
	res := e.pgbench(ctx, db, script, norgs, c, "-T", strconv.Itoa(max(1, int(t.Dur.Round(time.Second).Seconds()))),
		"-l", "--log-prefix", filepath.Join(logDir, "tx"))
	r.RPS = res.TPS
	r.Errors = res.Failed
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

// readTxLogs reads the transaction latencies of pgbench's -l logs
// (third field: microseconds), sorted.
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
			fs := strings.Fields(line)
			if len(fs) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fs[2], 10, 64)
			if err != nil {
				continue
			}
			lat = append(lat, time.Duration(us)*time.Microsecond)
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
		return lastLines(s, 4)
	}
	return strings.Join(errs, " | ")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// checkScript runs the script for a few transactions and fails when
// PostgreSQL refuses it.
func (e *env) checkScript(ctx context.Context, script string, norgs int) error {
	db, err := e.fresh(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	res := e.pgbench(ctx, db, script, norgs, 2, "-t", "5")
	if res.Aborted || res.Done != 10 || res.Failed > 0 {
		return fmt.Errorf("pgbench could not run the captured script: %s", pgbenchErrors(res.Output))
	}
	return nil
}
