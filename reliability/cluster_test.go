package reliability

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"gorm.io/gorm"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/migrations"
	"github.com/valruns/valruns/models"
)

// suite is what every scenario shares: the binary and the private services.
type suite struct {
	bin      string
	pg       *pgServer
	redis    *redisServer
	template string
	settings []string      // NAME=value for every valruns child
	cfg      config.Config // the configuration the children run with
}

func newSuite(t *testing.T) *suite {
	t.Helper()
	s := &suite{bin: proctest.Binary(t)}
	s.pg = startPostgres(t)
	s.redis = startRedis(t)
	s.template = "valruns_reliability_tmpl"
	s.adminExec(t, `CREATE DATABASE `+s.template)
	db, err := sql.Open("pgx", s.pg.url(s.template))
	if err != nil {
		t.Fatal(err)
	}
	p, err := migrations.NewProvider(db)
	if err == nil {
		_, err = p.Up(context.Background())
	}
	_ = db.Close()
	if err != nil {
		t.Fatalf("migrate template: %v", err)
	}
	s.settings, s.cfg = childSettings(t)
	return s
}

// adminExec runs a statement on the private server's maintenance database,
// on a connection of its own (a PostgreSQL restart kills pooled ones).
func (s *suite) adminExec(t testing.TB, stmt string) {
	t.Helper()
	if err := execOnce(s.pg.url("postgres"), stmt, 30*time.Second); err != nil {
		t.Errorf("%s: %v", stmt, err)
	}
}

// execOnce runs stmt on the database at url, on a connection of its own
// that it closes, within timeout.
func execOnce(url, stmt string, timeout time.Duration) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// Short timings so that faults heal in seconds. Settings are set only when
// config.Vars lists them; a setting this suite would like but the service
// lacks is logged, and the scenarios run all the same, so they fail on their
// merits rather than being skipped.
var wantSettings = []struct{ name, value string }{
	{"AUTH_CACHE_TTL", "1s"},       // revoked tokens stop working fast; auth reads the database often
	{"RUN_LEASE", "5s"},            // a run held by a dead worker is free soon
	{"RUN_FAST_PATH", "0"},         // every run under a lease: the kill and pause scenarios catch workers holding them
	{"RUN_HEARTBEAT", "1s"},        // ... while a live worker keeps it
	{"RUN_SWEEP_INTERVAL", "2s"},   // lost runs are looked for often
	{"RUN_REDELIVER_AFTER", "2s"},  // ... and redelivered soon
	{"RUN_RETRY_DELAY", "500ms"},   // a transient failure is retried soon
	{"RUN_POLL_INTERVAL", "500ms"}, // ... once due, and the cleanup runs at each of its ticks
	{"WORKER_CONCURRENCY", "2"},    // slow runs are CPU-bound: 2 cores
	{"ORG_RUN_SHARE", "4"},         // one run per worker slot (2 workers x 2): noisy_neighbour's bound, 2 x slots, is this share plus a slot's worth of A's runs handed out after B's but claimed a moment before it
	{"SHUTDOWN_TIMEOUT", "2s"},
	{"IDEMPOTENCY_TX_TIMEOUT", "10s"},
	{"MAX_BODY_BYTES", "1048576"},
	{"LOG_FORMAT", "json"},
	{"WEBHOOK_ALLOW_PRIVATE_TARGETS", "true"}, // webhook_outage's receiver is on loopback
	{"WEBHOOK_RETRY_BASE", "4s"},              // attempts at 4, 16 and 64 s: past webhook_outage's 60 s
	{"WEBHOOK_POLL_INTERVAL", "200ms"},
	{"LOG_LEVEL", "info"},
}

// childSettings returns the settings of every valruns child (NAME=value)
// and the configuration the children will have. A setting the
// configuration does not know, or refuses, fails the suite: its timings
// are what the recovery scenarios' bounds rest on.
func childSettings(t *testing.T) ([]string, config.Config) {
	t.Helper()
	known := map[string]bool{}
	for _, v := range config.Vars {
		known[v.Name] = true
	}
	set := map[string]string{}
	for _, w := range wantSettings {
		if !known[w.name] {
			t.Fatalf("setting %s is not in config.Vars", w.name)
		}
		set[w.name] = w.value
	}
	if _, err := config.Load(func(name string) (string, bool) { v, ok := set[name]; return v, ok }); err != nil {
		t.Fatalf("the suite's settings are refused: %v", err)
	}
	cfg, _ := config.Load(func(name string) (string, bool) { v, ok := set[name]; return v, ok })
	var env []string
	for _, v := range config.Vars { // config.Vars order: a stable log line
		if val, ok := set[v.Name]; ok {
			env = append(env, v.Name+"="+val)
		}
	}
	t.Logf("valruns children run with %s", strings.Join(env, " "))
	return env, cfg
}

// cluster is one scenario's system: a fresh database, two API replicas and
// two workers on the private PostgreSQL and Redis.
type cluster struct {
	t       *testing.T
	s       *suite
	dbName  string
	dbURL   string
	db      *sql.DB
	gdb     *gorm.DB
	servers []*vproc
	workers []*vproc
	// extraEnv are settings of this scenario's children (newClusterWith).
	extraEnv []string
}

// vproc is a running valruns child.
type vproc struct {
	*child
	url string // the API (servers) or the metrics server (workers)
}

// newCluster creates a fresh database from the migrated template and starts
// nServers `valruns serve` and nWorkers `valruns worker`.
func newCluster(t *testing.T, s *suite, nServers, nWorkers int) *cluster {
	t.Helper()
	return newClusterWith(t, s, nServers, nWorkers, nil)
}

// newClusterWith is newCluster whose children also get the settings env
// returns (NAME=value, winning over the suite's), called once the
// scenario's database exists.
func newClusterWith(t *testing.T, s *suite, nServers, nWorkers int, env func(*cluster) []string) *cluster {
	t.Helper()
	c := &cluster{t: t, s: s}
	var b [5]byte
	_, _ = rand.Read(b[:])
	c.dbName = "valruns_rel_" + hex.EncodeToString(b[:])
	s.adminExec(t, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, c.dbName, s.template))
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() { s.adminExec(t, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, c.dbName)) })
	c.dbURL = s.pg.url(c.dbName)
	c.reconnect()
	t.Cleanup(func() { _ = c.db.Close() })
	if err := s.redis.flush(); err != nil {
		t.Fatal(err)
	}
	if env != nil {
		c.extraEnv = env(c)
	}

	var wg sync.WaitGroup
	c.servers = make([]*vproc, nServers)
	c.workers = make([]*vproc, nWorkers)
	for i := range nServers {
		wg.Go(func() { c.servers[i] = c.startProc(fmt.Sprintf("api-%c", 'A'+i), "serve", "HTTP_ADDR") })
	}
	for i := range nWorkers {
		wg.Go(func() { c.workers[i] = c.startProc(fmt.Sprintf("worker-%c", 'A'+i), "worker", "WORKER_METRICS_ADDR") })
	}
	wg.Wait()
	for _, p := range append(append([]*vproc{}, c.servers...), c.workers...) {
		if p == nil {
			t.FailNow() // startProc reported why
		}
	}
	return c
}

// startProc starts `valruns cmd` (its words split on spaces, such as
// "serve --worker") listening on a free address given in addrVar and waits
// for its /healthz.
func (c *cluster) startProc(name, cmd, addrVar string) *vproc {
	addr := freeAddr(c.t)
	kv := append([]string{"DATABASE_URL=" + c.dbURL, "REDIS_URL=" + c.s.redis.url(), addrVar + "=" + addr}, c.s.settings...)
	kv = append(kv, c.extraEnv...)
	env := proctest.Env(kv...)
	// A memory ceiling (a container's, in production): a child gone wild
	// (a rule that doubles a string) dies alone instead of taking the
	// shared machine's memory. A Go process maps about 2 GB at rest.
	ch, err := startChild(name, "/bin/sh", append([]string{"-c", `ulimit -v 6291456 && exec "$0" "$@"`, c.s.bin}, strings.Fields(cmd)...), env, nil, "")
	if err != nil {
		c.t.Error(err)
		return nil
	}
	p := &vproc{child: ch, url: "http://" + addr}
	c.t.Cleanup(func() {
		p.stop(syscall.SIGKILL, 0)
		if c.t.Failed() {
			c.t.Logf("--- output of %s (pid %d), last lines:\n%s", p.name, p.pid(), p.tail(60))
		}
	})
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if p.exited() {
			c.t.Errorf("%s exited before answering /healthz:\n%s", name, p.tail(40))
			return nil
		}
		if resp, err := hc.Get(p.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			c.t.Errorf("%s never answered /healthz:\n%s", name, p.tail(40))
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) baseURLs() []string {
	urls := make([]string, len(c.servers))
	for i, s := range c.servers {
		urls[i] = s.url
	}
	return urls
}

// org is an organisation with an API token.
type org struct {
	ID, Name, Token, TokenID string
}

func (c *cluster) newOrg(name string) org {
	c.t.Helper()
	ctx := context.Background()
	o, err := models.NewOrgStore(c.gdb).Create(ctx, name)
	if err != nil {
		c.t.Fatal(err)
	}
	tok, row, err := models.NewTokenStore(c.gdb).Create(ctx, o.ID)
	if err != nil {
		c.t.Fatal(err)
	}
	return org{ID: o.ID, Name: name, Token: tok, TokenID: row.ID}
}

// reconnect opens the suite's own pool on the scenario's database afresh
// (after a PostgreSQL restart every pooled connection is dead).
func (c *cluster) reconnect() {
	c.t.Helper()
	if c.db != nil {
		_ = c.db.Close()
	}
	gdb, err := models.Open(context.Background(), c.dbURL+"&application_name="+suiteAppName, models.DBOptions{MaxOpenConns: 8})
	if err != nil {
		c.t.Fatal(err)
	}
	c.gdb, c.db = gdb, models.SQLDB(gdb)
}

// suiteAppName is the application_name of the suite's own connections to
// a scenario's database, which a scenario counting the children's tells apart.
const suiteAppName = "valruns-reliability"

// count runs a count query on the scenario's database.
func (c *cluster) count(q string, args ...any) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	err := c.db.QueryRowContext(ctx, q, args...).Scan(&n)
	return n, err
}
