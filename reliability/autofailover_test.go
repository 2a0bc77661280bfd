package reliability

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valruns/valruns/migrations"
)

// Ports of the pg_failover scenario's monitor and data nodes.
const autoFailoverPortFirst, autoFailoverPortLast = 18330, 18339

// autoctlBin finds pg_autoctl (Debian's pg-auto-failover-cli) and the
// monitor's extension for the PostgreSQL of pgBin (postgresql-NN-auto-failover),
// installed with apt-get when missing and the suite runs as root.
func autoctlBin(t testing.TB, pgBin string) string {
	t.Helper()
	major := filepath.Base(filepath.Dir(pgBin))
	ext := filepath.Join("/usr/share/postgresql", major, "extension", "pgautofailover.control")
	find := func() string {
		if _, err := os.Stat(ext); err != nil {
			return ""
		}
		for _, p := range []string{filepath.Join(pgBin, "pg_autoctl"), "/usr/bin/pg_autoctl"} {
			if isExec(p) {
				return p
			}
		}
		if p, err := exec.LookPath("pg_autoctl"); err == nil {
			return p
		}
		return ""
	}
	if p := find(); p != "" {
		return p
	}
	pkgs := []string{"postgresql-" + major + "-auto-failover", "pg-auto-failover-cli"}
	if aptInstall(t, pkgs...) {
		if p := find(); p != "" {
			return p
		}
	}
	t.Fatalf("the pg_failover scenario needs pg_auto_failover: install the Debian packages %s (apt-get install %s), or run the suite as root, which installs them",
		strings.Join(pkgs, " and "), strings.Join(pkgs, " "))
	return ""
}

// pgNode is a data node of the formation: its pg_autoctl (keeper and
// postgres under it) as a child process.
type pgNode struct {
	name  string
	port  int
	pgdat string
	proc  *child
}

// formation is a pg_auto_failover formation on loopback: a monitor and two
// data nodes, each run by `pg_autoctl create ... --run` as a child process
// (as the postgres OS user when the suite runs as root: pg_autoctl refuses
// root), with synchronous replication while both data nodes are up.
type formation struct {
	t       testing.TB
	bin     string // pg_autoctl
	pgBin   string
	dir     string
	env     []string
	cred    *syscall.Credential
	monPort int
	monitor *child
	nodes   []*pgNode
}

func startFormation(t testing.TB, pg *pgServer) *formation {
	t.Helper()
	f := &formation{t: t, pgBin: pg.bin, cred: pg.cred}
	f.bin = autoctlBin(t, pg.bin)
	// Not t.TempDir: its parent is root's alone, and pg_autoctl runs as postgres.
	dir, err := os.MkdirTemp("", "valruns-reliability-autofailover-")
	if err != nil {
		t.Fatal(err)
	}
	f.dir = dir
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	xdg := map[string]string{"XDG_CONFIG_HOME": "config", "XDG_DATA_HOME": "data", "XDG_RUNTIME_DIR": "run"}
	for _, sub := range xdg {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if f.cred != nil {
		if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Chown(p, int(f.cred.Uid), int(f.cred.Gid))
		}); err != nil {
			t.Fatal(err)
		}
	}
	// pg_autoctl keeps its state under the XDG directories; a PGHOST (or
	// any PG* setting) of the caller would redirect its connections.
	for _, e := range os.Environ() {
		name, _, _ := strings.Cut(e, "=")
		if strings.HasPrefix(name, "PG") || strings.HasPrefix(name, "XDG_") || name == "HOME" {
			continue
		}
		f.env = append(f.env, e)
	}
	for name, sub := range xdg {
		f.env = append(f.env, name+"="+filepath.Join(dir, sub))
	}
	f.env = append(f.env, "HOME="+dir, "PATH="+pg.bin+":"+os.Getenv("PATH"))

	f.monPort = freePortIn(t, autoFailoverPortFirst, autoFailoverPortLast, "pg_auto_failover monitor")
	f.monitor = f.run("monitor", "create", "monitor", "--pgdata", filepath.Join(dir, "monitor"),
		"--pgport", strconv.Itoa(f.monPort), "--hostname", "127.0.0.1")
	if !waitUntil(60*time.Second, func() bool {
		_, err := f.monitorQuery(`SELECT count(*) FROM pgautofailover.formation`)
		return err == nil && !f.monitor.exited()
	}) {
		t.Fatalf("the pg_auto_failover monitor on port %d is not ready:\n%s", f.monPort, f.monitor.tail(30))
	}
	f.addNode("node1")
	if !f.waitStates(60*time.Second, "single") {
		t.Fatalf("node1 did not become a single primary: %s\n%s", f.states(), f.nodes[0].proc.tail(30))
	}
	f.addNode("node2")
	// pg_basebackup waits for a checkpoint, spread over minutes unless
	// one is asked for at once: CHECKPOINT on the primary until the
	// secondary has its copy.
	if !waitUntil(2*time.Minute, func() bool {
		_ = f.exec(f.nodes[0], "postgres", `CHECKPOINT`)
		return f.statesAre("primary", "secondary")
	}) {
		t.Fatalf("node2 did not become node1's secondary: %s\n%s", f.states(), f.nodes[1].proc.tail(30))
	}
	f.tune()
	return f
}

// Failover timeouts shorter than pg_auto_failover's defaults, so that a
// whole node lost (keeper and postmaster: nobody reports it) is served
// again within 30 s rather than about 50. The monitor promotes a silent
// primary's standby no earlier than node_considered_unhealthy_timeout
// after the primary's last report (and its health checks failing), then
// primary_demote_timeout more; a primary cut off from the monitor and its
// standby stops its PostgreSQL network_partition_timeout after its last
// contact (plus a keeper loop of 1 s and a fast shutdown). 8 + 12 = 20 s
// against 10 + 1 s keeps the order pg_auto_failover's defaults keep (20 +
// 30 against 20): the old primary has demoted itself before the standby
// is promoted.
var (
	// monitorSettings are the monitor's GUCs (ALTER SYSTEM, reloaded).
	monitorSettings = [][2]string{
		{"pgautofailover.health_check_period", "2000"},               // ms, default 5000: a round of checks
		{"pgautofailover.health_check_timeout", "2000"},              // ms, default 5000: one connect attempt
		{"pgautofailover.health_check_retry_delay", "1000"},          // ms, default 2000; 2 retries kept
		{"pgautofailover.node_considered_unhealthy_timeout", "8000"}, // ms, default 20000: silence before a failover
		{"pgautofailover.primary_demote_timeout", "12000"},           // ms, default 30000
	}
	// nodeSettings are each data node's `pg_autoctl config set`.
	nodeSettings = [][2]string{
		{"timeout.network_partition_timeout", "10"}, // s, default 20
	}
)

// tune applies monitorSettings and nodeSettings to the running formation.
func (f *formation) tune() {
	f.t.Helper()
	for _, kv := range monitorSettings {
		if err := f.monitorExec(fmt.Sprintf(`ALTER SYSTEM SET %s = %s`, kv[0], kv[1])); err != nil {
			f.t.Fatalf("set %s on the monitor: %v", kv[0], err)
		}
	}
	if err := f.monitorExec(`SELECT pg_reload_conf()`); err != nil {
		f.t.Fatalf("reload the monitor's settings: %v", err)
	}
	for _, n := range f.nodes {
		for _, kv := range nodeSettings {
			// Written to the node's pg_autoctl.cfg, and the running
			// keeper is told to reload it.
			if out, err := f.autoctl(30*time.Second, "config", "set", "--pgdata", n.pgdat, kv[0], kv[1]); err != nil {
				f.t.Fatalf("pg_autoctl config set %s on %s: %v\n%s", kv[0], n.name, err, out)
			}
		}
	}
}

// autoctl runs `pg_autoctl ARGS` as the formation's OS user, to its end.
func (f *formation) autoctl(timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, f.bin, args...)
	cmd.Env, cmd.Dir = f.env, f.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred}
	return cmd.CombinedOutput()
}

// monitorExec runs a statement on the monitor's postgres database as the
// superuser (the OS user pg_autoctl runs as).
func (f *formation) monitorExec(stmt string) error {
	return execOnce(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", f.monPort), stmt, 10*time.Second)
}

// run starts `pg_autoctl ARGS --auth trust --no-ssl --run` as a child
// process, stopped when the test ends.
func (f *formation) run(name string, args ...string) *child {
	f.t.Helper()
	args = append(args, "--pgctl", filepath.Join(f.pgBin, "pg_ctl"), "--auth", "trust", "--no-ssl", "--run")
	c, err := startChild(name, f.bin, args, f.env, f.cred, f.dir)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		// SIGTERM to the group: pg_autoctl stops its postgres (fast mode)
		// and itself.
		c.stop(syscall.SIGTERM, 15*time.Second)
		if f.t.Failed() {
			f.t.Logf("--- output of pg_autoctl %s, last lines:\n%s", name, c.tail(40))
		}
	})
	return c
}

// addNode creates and runs a data node, listening on 127.0.0.1.
func (f *formation) addNode(name string) {
	f.t.Helper()
	n := &pgNode{name: name, port: freePortIn(f.t, autoFailoverPortFirst, autoFailoverPortLast, "pg_auto_failover node"),
		pgdat: filepath.Join(f.dir, name)}
	f.nodes = append(f.nodes, n)
	n.proc = f.run(name, "create", "postgres", "--pgdata", n.pgdat, "--pgport", strconv.Itoa(n.port),
		"--listen", "127.0.0.1", "--hostname", "127.0.0.1", "--name", name, "--monitor", f.monitorURL())
	// A postmaster pg_autoctl restarted (after the kill) is its child, in
	// its process group; one left running by a failed stop is ended here.
	f.t.Cleanup(func() {
		if pid := n.postmaster(); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
		}
	})
}

func (f *formation) monitorURL() string {
	return fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.monPort)
}

// url is database db on the formation, for valruns: every data node, the
// writable one chosen at each connect.
func (f *formation) url(db string) string {
	hosts := make([]string, len(f.nodes))
	for i, n := range f.nodes {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(n.port)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write", strings.Join(hosts, ","), db)
}

// monitorQuery reads one text value from the monitor.
func (f *formation) monitorQuery(q string, args ...any) (string, error) {
	return queryOnce(f.monitorURL(), q, args...)
}

// queryOnce reads one text value from the database at url, on a
// connection of its own that it closes, within 3 s.
func queryOnce(url, q string, args ...any) (string, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return "", err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var s string
	err = db.QueryRowContext(ctx, q, args...).Scan(&s)
	return s, err
}

// states is "node1 reported/assigned, node2 ..." as the monitor has them.
func (f *formation) states() string {
	s, err := f.monitorQuery(`SELECT string_agg(nodename || ' ' || reportedstate || '/' || goalstate, ', ' ORDER BY nodeid) FROM pgautofailover.node`)
	if err != nil {
		return err.Error()
	}
	return s
}

// statesAre reports whether node1 and node2 (in order) have reported, and
// been assigned, the states want.
func (f *formation) statesAre(want ...string) bool {
	var parts []string
	for i, w := range want {
		parts = append(parts, fmt.Sprintf("node%d %s/%s", i+1, w, w))
	}
	return f.states() == strings.Join(parts, ", ")
}

// waitStates waits until the nodes are in the states want (see statesAre).
func (f *formation) waitStates(timeout time.Duration, want ...string) bool {
	return waitUntil(timeout, func() bool { return f.statesAre(want...) })
}

// whole reports whether the formation can lose its primary without losing
// a commit it acknowledged: one node primary and the other secondary, each
// reported as assigned (exactly: a "wait_primary/primary" node is still
// committing without its standby), and the primary's synchronous
// replication on, a standby streaming as its synchronous one.
func (f *formation) whole() bool {
	if !f.statesAre("primary", "secondary") && !f.statesAre("secondary", "primary") {
		return false
	}
	p := f.primary()
	if p == nil {
		return false
	}
	n, err := queryOnce(p.url("postgres"), `SELECT count(*)::text FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')`)
	return err == nil && n != "0"
}

// primary is the data node the monitor names primary, nil when none.
func (f *formation) primary() *pgNode {
	name, err := f.monitorQuery(`SELECT nodename FROM pgautofailover.node
		WHERE reportedstate IN ('single', 'wait_primary', 'primary') AND goalstate = reportedstate`)
	if err != nil {
		return nil
	}
	for _, n := range f.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// exec runs a statement on one data node's database db.
func (f *formation) exec(n *pgNode, db, stmt string) error {
	return execOnce(n.url(db), stmt, 30*time.Second)
}

// url is the URL of the node's database db, as the superuser.
func (n *pgNode) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", n.port, db)
}

// postmaster is the node's postmaster pid (postmaster.pid), 0 when it has none.
func (n *pgNode) postmaster() int {
	b, err := os.ReadFile(filepath.Join(n.pgdat, "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// switchover is `pg_autoctl perform switchover`: the monitor has the
// primary drained and demoted and the secondary promoted; it returns when
// the formation is whole again.
func (f *formation) switchover() error {
	out, err := f.autoctl(90*time.Second, "perform", "switchover", "--pgdata", f.nodes[0].pgdat, "--wait", "60")
	if err != nil {
		return fmt.Errorf("pg_autoctl perform switchover: %w\n%s", err, out)
	}
	return nil
}

// migrateOn creates database db on the formation's primary and migrates it
// through the multi-host URL, as `valruns migrate up` would.
func (f *formation) migrateOn(t testing.TB, db string) {
	t.Helper()
	if err := f.exec(f.primary(), "postgres", `CREATE DATABASE `+db); err != nil {
		t.Fatalf("create the scenario's database on the primary: %v", err)
	}
	d, err := sql.Open("pgx", f.url(db))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p, err := migrations.NewProvider(d)
	if err == nil {
		_, err = p.Up(context.Background())
	}
	if err != nil {
		t.Fatalf("migrate the formation's database: %v", err)
	}
}

// window is one fault's answers to starts: from the fault to the first 201
// after the last 5xx, and what the starts got meanwhile.
type window struct {
	from, serving          time.Time
	created, unavail, rest int
	replayed               int // 201 replays (Idempotent-Replayed) among created
}

// measureWindow reads the ops' attempts from `from` on: serving is the
// first 201 after the last 5xx (or after from when there was none), and
// the counts are of the answers up to serving.
func measureWindow(ops []*op, from time.Time) window {
	w := window{from: from}
	lastErr := from
	for _, o := range ops {
		for _, a := range o.Out.Attempts {
			if a.At.Before(from) {
				continue
			}
			if a.Status >= 500 || a.Status == 0 {
				lastErr = maxTime(lastErr, a.At)
			}
		}
	}
	for _, o := range ops {
		for _, a := range o.Out.Attempts {
			if a.Status == 201 && a.At.After(lastErr) && (w.serving.IsZero() || a.At.Before(w.serving)) {
				w.serving = a.At
			}
		}
	}
	for _, o := range ops {
		for _, a := range o.Out.Attempts {
			if a.At.Before(from) || (!w.serving.IsZero() && a.At.After(w.serving)) {
				continue
			}
			switch {
			case a.Status == 201:
				w.created++
				if a.Replayed {
					w.replayed++
				}
			case a.Status == 503 && a.RetryAfter != "":
				w.unavail++
			default:
				w.rest++
			}
		}
	}
	return w
}

func (w window) took() time.Duration {
	if w.serving.IsZero() {
		return 0
	}
	return w.serving.Sub(w.from)
}

// pgFailover: valruns on a pg_auto_failover formation (a monitor, a primary
// and a synchronous secondary), 2 API replicas and 2 workers on the
// multi-host DATABASE_URL with target_session_attrs=read-write.
//   - 300 starts by 16 clients; once 100 are done, the primary's postmaster
//     gets `kill -9`. Its keeper reports it down, the monitor promotes the
//     secondary, and the old primary comes back as the new secondary
//     (pg_rewind).
//   - a new steady load; once 30 are done, a planned switchover (`pg_autoctl
//     perform switchover`); the load goes on until 2 s after it returned.
//   - a new steady load; once 30 are done, the primary node is lost: kill -9
//     of its pg_autoctl and its postmaster at once. Nobody reports it: the
//     monitor's health checks and timeouts (tune) have the secondary
//     promoted; the load goes on until 30 more are done, then 2 s.
//
// Required: no accepted (201) start lost, none doubled, every run final;
// in each switch only 503 with Retry-After (the COMMIT whose outcome a
// dead primary never told is retried under its key: one run). The time
// from the kill to serving again (the first 201 after the last 5xx) is
// the row's recovery; the switchover's and the node loss's windows are
// figures.
func pgFailover(t *testing.T, s *suite, res *result) {
	started := time.Now()
	f := startFormation(t, s.pg)
	formedIn := time.Since(started)
	c, cl, rec, o := setupWith(t, s, "failover", func(c *cluster) []string {
		// The scenario's database is on the formation, not the suite's
		// server: the suite's own pool (the checks) goes there too.
		f.migrateOn(t, c.dbName)
		c.dbURL = f.url(c.dbName)
		c.reconnect()
		return []string{"DATABASE_URL=" + c.dbURL}
	})
	def := orderWorkflow()
	wf := createWorkflow(t, cl, o, def)
	ctx := context.Background()

	// The failover: kill -9 of the primary's postmaster, while 16 clients
	// send starts as fast as they are answered, so that some COMMITs are
	// on their way (written on the primary, not yet acknowledged by the
	// standby) at the kill; their retries come a second later, when the
	// keeper has restarted the old primary. The load lasts through the
	// switch: every start is retried until it has its answer.
	// Each step waits for the formation's state, as the monitor reports
	// it, not for a number of seconds: on a starved machine tune's
	// settings, or a health check that timed out, keep a node between
	// states (apply_settings, wait_primary) for a while, and a primary
	// looked for then was not there.
	if !waitUntil(3*time.Minute, f.whole) {
		t.Fatalf("the formation was not whole before the load: %s", f.states())
	}
	killOps := makeOps("pgkill", 300, o, wf, def)
	l := startLoad(ctx, cl, killOps, 16)
	if !waitUntil(2*time.Minute, func() bool { return l.done.Load() >= 100 }) {
		t.Fatalf("the load did not get going: %d operations done", l.done.Load())
	}
	var old *pgNode
	if !waitUntil(2*time.Minute, func() bool {
		old = f.primary()
		return old != nil && old.postmaster() != 0 && f.whole()
	}) {
		t.Fatalf("no whole formation with a primary with a postmaster before the kill: %s", f.states())
	}
	killAt := time.Now()
	if err := syscall.Kill(old.postmaster(), syscall.SIGKILL); err != nil {
		t.Fatalf("kill the primary's postmaster: %v", err)
	}
	doneAtKill := l.done.Load()
	promoted := waitUntil(60*time.Second, func() bool { p := f.primary(); return p != nil && p != old })
	promotedIn := time.Since(killAt)
	if !promoted {
		res.fail(t, "the monitor promoted no other node within 60 s of the kill: %s", f.states())
	}
	l.wait()
	if doneAtKill >= int64(len(killOps)) {
		res.fail(t, "the load ended before the kill: the scenario proved nothing")
	}
	kill := measureWindow(killOps, killAt)
	t.Logf("primary %s killed after %d of %d starts; %s promoted by the monitor after %s; serving again after %s",
		old.name, doneAtKill, len(killOps), f.primary().nameOr("none"), promotedIn.Round(time.Millisecond), kill.took().Round(time.Millisecond))
	// The old primary comes back as the secondary (pg_rewind), so that the
	// switchover has a node to switch to; whole for a second, as the
	// primary passes through apply_settings when its standby returns.
	if !waitUntil(2*time.Minute, func() bool {
		if !f.whole() {
			return false
		}
		time.Sleep(time.Second)
		return f.whole()
	}) {
		t.Fatalf("the formation did not become whole after the failover: %s", f.states())
	}
	rejoinedIn := time.Since(killAt)

	// The planned switchover under load.
	sl := startSteadyLoad(ctx, cl, makeOps("pgswitch", 3000, o, wf, def))
	if !waitUntil(2*time.Minute, func() bool { return sl.done.Load() >= 30 }) {
		t.Fatalf("the load did not get going: %d operations done", sl.done.Load())
	}
	// The switchover is the fault this part injects. On a starved machine
	// the monitor may have no primary for a moment after the failover
	// (it refuses: "couldn't find the primary node"); then the injection is
	// tried again once the formation is whole, at most twice more, and
	// each refusal is logged. A switchover that never happens fails.
	var before *pgNode
	var switchAt time.Time
	var err error
	for try := 1; try <= 3; try++ {
		if try > 1 && !waitUntil(2*time.Minute, f.whole) {
			break
		}
		before, switchAt = f.primary(), time.Now()
		if err = f.switchover(); err == nil {
			break
		}
		t.Logf("switchover, try %d of 3, refused: %v (states: %s)", try, err, f.states())
	}
	if err != nil {
		res.fail(t, "%v", err)
	}
	switchCmd := time.Since(switchAt)
	time.Sleep(2 * time.Second)
	swOps, ranOut := sl.stop()
	if ranOut {
		res.fail(t, "the load ran out of operations before the switchover was over: the scenario proved less than it says")
	}
	if p := f.primary(); p == nil || p == before {
		res.fail(t, "after the switchover the primary is %s, was %s: %s", p.nameOr("none"), before.nameOr("none"), f.states())
	}
	sw := measureWindow(swOps, switchAt)
	t.Logf("switchover from %s: the command took %s; serving again after %s; %d starts in all", before.nameOr("none"),
		switchCmd.Round(time.Millisecond), sw.took().Round(time.Millisecond), len(swOps))

	// The node loss below is of a primary with a synchronous secondary:
	// until the demoted node is back as the secondary (pg_rewind, catching
	// up), the new primary is wait_primary and commits without a copy, and
	// losing it then loses what it acknowledged, as pg_auto_failover says.
	// (A run once killed it 20 s after a switchover that took 30 s on a
	// starved machine: 27 accepted starts were gone. The check then was a
	// substring, which "wait_primary/primary" matched: a primary assigned,
	// still committing without its standby. A CI run lost more than 60
	// starts the new primary had accepted since the switchover. So whole
	// reads the states exactly, and the primary's own replication.)
	if !waitUntil(3*time.Minute, f.whole) {
		res.fail(t, "the old primary did not come back as the secondary after the switchover: %s", f.states())
	}

	// The whole primary node lost: kill -9 of its pg_autoctl (supervisor
	// and keeper, the process group) and of its postmaster at once, so
	// that nothing restarts PostgreSQL and nobody reports to the monitor.
	// The monitor decides on its own timeouts (tune); the load goes on
	// until 30 starts are done after the promotion, then 2 s more.
	ll := startSteadyLoad(ctx, cl, makeOps("pgloss", 3000, o, wf, def))
	if !waitUntil(2*time.Minute, func() bool { return ll.done.Load() >= 30 }) {
		t.Fatalf("the load did not get going: %d operations done", ll.done.Load())
	}
	// Still whole at the loss: on a starved machine the monitor may have
	// taken synchronous replication off meanwhile (a standby it thought
	// unhealthy); the load goes on until it is back.
	if !waitUntil(2*time.Minute, f.whole) {
		t.Fatalf("the formation was not whole before the node loss: %s", f.states())
	}
	lost := f.primary()
	if lost == nil || lost.postmaster() == 0 {
		t.Fatalf("no primary with a postmaster before the node loss: %s", f.states())
	}
	pm := lost.postmaster()
	lossAt := time.Now()
	lost.proc.signal(syscall.SIGKILL)
	if err := syscall.Kill(pm, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("kill the primary's postmaster: %v", err)
	}
	lostPromoted := waitUntil(2*time.Minute, func() bool { p := f.primary(); return p != nil && p != lost })
	lostPromotedIn := time.Since(lossAt)
	if !lostPromoted {
		res.fail(t, "the monitor promoted no other node within 2 min of the node loss: %s", f.states())
	} else {
		doneAt := ll.done.Load()
		if !waitUntil(time.Minute, func() bool { return ll.done.Load() >= doneAt+30 }) {
			res.fail(t, "the load did not go on after the promotion: %d operations done", ll.done.Load())
		}
		time.Sleep(2 * time.Second)
	}
	lossOps, ranOut := ll.stop()
	if ranOut {
		res.fail(t, "the load ran out of operations before the node loss was over: the scenario proved less than it says")
	}
	loss := measureWindow(lossOps, lossAt)
	t.Logf("node %s lost; %s promoted by the monitor after %s; serving again after %s; %d starts in all: %s",
		lost.name, f.primary().nameOr("none"), lostPromotedIn.Round(time.Millisecond), loss.took().Round(time.Millisecond), len(lossOps), f.states())

	all := slices.Concat(killOps, swOps, lossOps)
	c.reconnect()
	verify(t, c, res, all, expectations{faultAt: killAt})
	if res.Losses > 0 {
		// What the monitor decided, for a run whose process logs are gone
		// (RELIABILITY_LOG_DIR keeps them all).
		events, err := f.monitorQuery(`SELECT string_agg(to_char(eventtime, 'HH24:MI:SS.MS') || ' ' || nodename || ' ' ||
			reportedstate || '/' || goalstate || ' ' || reportedlsn || ': ' || coalesce(description, ''), E'\n' ORDER BY eventid)
			FROM pgautofailover.event WHERE eventtime >= $1`, killAt.Add(-time.Minute))
		if err != nil {
			events = err.Error()
		}
		t.Logf("the monitor's events since a minute before the first kill:\n%s", events)
	}
	if dir := os.Getenv("RELIABILITY_LOG_DIR"); dir != "" {
		f.writeLogs(dir, c, all)
	}
	res.Requests = rec.requests.Load()
	// Expected: a 503 problem with Retry-After from each switch until 10 s
	// after the first 201 past it (pools find their dead connections on
	// use). Any other 5xx, and any 500, is unexpected; a 4xx the contract
	// allows a retry to meet (409 while its first attempt is in flight) is
	// counted, and judged by the operation's definitive answer (verify).
	in := func(e serverError, w window) bool {
		end := w.serving
		if end.IsZero() {
			end = time.Now()
		}
		return !e.At.Before(w.from) && !e.At.After(end.Add(10*time.Second))
	}
	res.judge5xx(t, rec, func(e serverError) bool {
		return e.Status == 503 && e.RetryAfter != "" && e.Problem && (in(e, kill) || in(e, sw) || in(e, loss))
	})
	for _, w := range []struct {
		name string
		w    window
	}{{"kill", kill}, {"switchover", sw}, {"node loss", loss}} {
		if w.w.serving.IsZero() {
			res.fail(t, "no start was answered 201 after the last 5xx of the %s", w.name)
		}
	}
	// The row's recovery is the kill to serving again, not to every run final.
	if !kill.serving.IsZero() {
		res.Recovery = kill.took()
	}
	res.Figures = append(res.Figures,
		fmt.Sprintf("kill -9 of the primary's postmaster to serving again (first 201 after the last 5xx): %.1f s (the monitor named the new primary after %.1f s; the old one was back as the secondary after %.1f s); meanwhile %d starts answered 201 (%d replays), %d 503 with Retry-After, %d other answers",
			kill.took().Seconds(), promotedIn.Seconds(), rejoinedIn.Seconds(), kill.created, kill.replayed, kill.unavail, kill.rest),
		fmt.Sprintf("pg_autoctl perform switchover under load: serving again after %.1f s (the command returned after %.1f s); meanwhile %d starts answered 201 (%d replays), %d 503 with Retry-After, %d other answers",
			sw.took().Seconds(), switchCmd.Seconds(), sw.created, sw.replayed, sw.unavail, sw.rest),
		fmt.Sprintf("the primary node lost (kill -9 of its pg_autoctl and postmaster) to serving again: %.1f s (the monitor named the new primary after %.1f s); meanwhile %d starts answered 201 (%d replays), %d 503 with Retry-After, %d other answers",
			loss.took().Seconds(), lostPromotedIn.Seconds(), loss.created, loss.replayed, loss.unavail, loss.rest),
		fmt.Sprintf("the formation (monitor, primary, secondary) was ready %.1f s after the scenario began; the scenario took %.0f s",
			formedIn.Seconds(), time.Since(started).Seconds()))
}

// steadyLoad sends operations with 6 clients, each pausing 100 ms between
// its operations (about 50 a second in all), until stop: a load that
// lasts as long as the switch it spans, however long that takes.
type steadyLoad struct {
	ops     []*op
	next    atomic.Int64
	done    atomic.Int64
	stopped atomic.Bool
	wg      sync.WaitGroup
}

func startSteadyLoad(ctx context.Context, cl *client, ops []*op) *steadyLoad {
	l := &steadyLoad{ops: ops}
	for range 6 {
		l.wg.Go(func() {
			for !l.stopped.Load() {
				i := int(l.next.Add(1) - 1)
				if i >= len(ops) {
					return
				}
				ops[i].finish(cl.do(ctx, ops[i].request(), i))
				l.done.Add(1)
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	return l
}

// stop waits for the operations under way and returns those started;
// ranOut says every operation was started before stop was called.
func (l *steadyLoad) stop() (started []*op, ranOut bool) {
	ranOut = l.next.Load() >= int64(len(l.ops))
	l.stopped.Store(true)
	l.wg.Wait()
	return l.ops[:min(int(l.next.Load()), len(l.ops))], ranOut
}

// writeLogs writes every process's output and the operations' attempts
// into dir (RELIABILITY_LOG_DIR), for a look at a switch afterwards.
func (f *formation) writeLogs(dir string, c *cluster, ops []*op) {
	for _, p := range append(append([]*vproc{}, c.servers...), c.workers...) {
		_ = os.WriteFile(filepath.Join(dir, p.name+".log"), []byte(p.log.String()), 0o644)
	}
	for _, ch := range []*child{f.monitor, f.nodes[0].proc, f.nodes[1].proc} {
		_ = os.WriteFile(filepath.Join(dir, ch.name+".log"), []byte(ch.log.String()), 0o644)
	}
	var b strings.Builder
	for _, o := range ops {
		fmt.Fprintf(&b, "%s run=%s\n", o.Key, o.RunID)
		for _, a := range o.Out.Attempts {
			fmt.Fprintf(&b, "  %s replica=%d status=%d replayed=%v code=%s err=%s\n",
				a.At.Format("15:04:05.000"), a.Replica, a.Status, a.Replayed, a.Code, a.Err)
		}
	}
	_ = os.WriteFile(filepath.Join(dir, "ops.txt"), []byte(b.String()), 0o644)
}

// nameOr is the node's name, or other for no node.
func (n *pgNode) nameOr(other string) string {
	if n == nil {
		return other
	}
	return n.name
}
