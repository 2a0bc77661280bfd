package reliability

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/tasks"
)

// Ports of the Sentinel scenario's Redis servers and sentinels.
const sentinelPortFirst, sentinelPortLast = 18310, 18329

const sentinelMaster = "valruns"

// redisNode is a redis-server or a sentinel the Sentinel scenario runs.
type redisNode struct {
	name string
	port int
	proc *child
}

func (n *redisNode) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

func (n *redisNode) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.addr(), DialTimeout: time.Second, ReadTimeout: 2 * time.Second,
		MaxRetries: -1, PoolSize: 2})
}

// sentinelBin finds redis-sentinel (Debian's package of that name),
// installed with apt-get when missing and the suite runs as root.
func sentinelBin(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("redis-sentinel"); err == nil {
		return p
	}
	if aptInstall(t, "redis-sentinel") {
		if p, err := exec.LookPath("redis-sentinel"); err == nil {
			return p
		}
	}
	t.Fatalf("the sentinel scenario needs redis-sentinel: install the Debian package redis-sentinel (apt-get install redis-sentinel), or run the suite as root, which installs it")
	return ""
}

// sentinelSet is 1 master, 1 replica and 3 sentinels (quorum 2) on
// loopback, without persistence, each from a config file of its own.
type sentinelSet struct {
	t                 testing.TB
	master, replica   *redisNode
	sentinels         []*redisNode
	downAfter         time.Duration
	dir               string
	redisBin, sentBin string
}

func startSentinelSet(t testing.TB) *sentinelSet {
	t.Helper()
	ss := &sentinelSet{t: t, redisBin: redisBin(t), sentBin: sentinelBin(t), dir: t.TempDir(), downAfter: time.Second}
	port := func() int { return freePortIn(t, sentinelPortFirst, sentinelPortLast, "Redis Sentinel node") }
	ss.master = ss.startRedis("redis-master", port())
	ss.replica = ss.startRedis("redis-replica", port(), "--replicaof", "127.0.0.1", strconv.Itoa(ss.master.port))
	for i := range 3 {
		ss.sentinels = append(ss.sentinels, ss.startSentinel(fmt.Sprintf("sentinel-%d", i+1), port()))
	}
	ctx := context.Background()
	// Ready: the replica in sync, and every sentinel knows the replica and
	// the two other sentinels (a failover needs a majority's votes).
	rc := ss.replica.client()
	defer rc.Close()
	if !waitUntil(60*time.Second, func() bool {
		info, _ := rc.Info(ctx, "replication").Result()
		return strings.Contains(info, "master_link_status:up")
	}) {
		t.Fatalf("the replica never synced with the master:\n%s", ss.replica.proc.tail(20))
	}
	for _, s := range ss.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr(), DialTimeout: time.Second})
		ok := waitUntil(60*time.Second, func() bool {
			reps, err1 := sc.Replicas(ctx, sentinelMaster).Result()
			others, err2 := sc.Sentinels(ctx, sentinelMaster).Result()
			return err1 == nil && err2 == nil && len(reps) == 1 && len(others) == 2
		})
		_ = sc.Close()
		if !ok {
			t.Fatalf("%s never saw the replica and the two other sentinels:\n%s", s.name, s.proc.tail(20))
		}
	}
	return ss
}

func (ss *sentinelSet) startRedis(name string, port int, extra ...string) *redisNode {
	ss.t.Helper()
	dir := filepath.Join(ss.dir, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		ss.t.Fatal(err)
	}
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--protected-mode", "no", "--daemonize", "no"}, extra...)
	return ss.run(name, port, ss.redisBin, args, dir)
}

// run starts a Redis server or sentinel and waits until it answers PING.
func (ss *sentinelSet) run(name string, port int, bin string, args []string, dir string) *redisNode {
	ss.t.Helper()
	p, err := startChild(name, bin, args, os.Environ(), nil, dir)
	if err != nil {
		ss.t.Fatal(err)
	}
	n := &redisNode{name: name, port: port, proc: p}
	ss.t.Cleanup(p.kill)
	c := n.client()
	defer c.Close()
	if !waitUntil(30*time.Second, func() bool { return c.Ping(context.Background()).Err() == nil }) {
		ss.t.Fatalf("%s on port %d not ready:\n%s", name, port, p.tail(20))
	}
	return n
}

func (ss *sentinelSet) startSentinel(name string, port int) *redisNode {
	ss.t.Helper()
	dir := filepath.Join(ss.dir, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		ss.t.Fatal(err)
	}
	// Sentinel rewrites its config file: one per sentinel, writable.
	conf := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s 10000
sentinel parallel-syncs %s 1
`, port, dir, sentinelMaster, ss.master.port, sentinelMaster, ss.downAfter.Milliseconds(), sentinelMaster, sentinelMaster)
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		ss.t.Fatal(err)
	}
	return ss.run(name, port, ss.sentBin, []string{path}, dir)
}

// url is REDIS_URL in its Sentinel form.
func (ss *sentinelSet) url() string {
	addrs := make([]string, len(ss.sentinels))
	for i, s := range ss.sentinels {
		addrs[i] = s.addr()
	}
	return "redis-sentinel://" + strings.Join(addrs, ",") + "/0?master=" + sentinelMaster
}

// masterAddr is the master the sentinels name now ("" when they do not answer).
func (ss *sentinelSet) masterAddr() string {
	for _, s := range ss.sentinels {
		if s.proc.exited() {
			continue
		}
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr(), DialTimeout: time.Second})
		addr, err := sc.GetMasterAddrByName(context.Background(), sentinelMaster).Result()
		_ = sc.Close()
		if err == nil && len(addr) == 2 {
			return net.JoinHostPort(addr[0], addr[1])
		}
	}
	return ""
}

// workerCounter sums a counter of every worker's /metrics whose line
// starts with prefix (a metric name and its labels).
func workerCounter(c *cluster, prefix string) int64 {
	hc := &http.Client{Timeout: 2 * time.Second}
	var total int64
	for _, w := range c.workers {
		resp, err := hc.Get(w.url + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, prefix) {
				continue
			}
			f := strings.Fields(line)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				total += int64(v)
			}
		}
		resp.Body.Close()
	}
	return total
}

// sentinelFailover: valruns on Redis Sentinel (REDIS_URL in its Sentinel
// form), 1 master, 1 replica and 3 sentinels. Slow runs are started until
// runs wait in Redis, and cheap ones by 6 clients; the replica is stopped
// (SIGSTOP) for a second so that the master holds writes the replica never
// got (replication is asynchronous: what a real failover may lose), and
// the workers with it, so that the runs started meanwhile wait in the
// master alone; then the master gets `kill -9`, and the replica and the
// workers continue. Sentinel promotes
// it. Required:
//   - the workers, the API's hand-off and the scheduler continue on the
//     new master: every run final, none doubled, no 5xx (starts never need
//     Redis);
//   - the tasks lost with the old master are recovered: the sweeper
//     re-enqueues runs (valruns_runs_redelivered_total grows);
//   - the cleanup (CLEANUP_SCHEDULE=@every 1s here) runs after the
//     promotion, once per tick.
func sentinelFailover(t *testing.T, s *suite, res *result) {
	ss := startSentinelSet(t)
	c := newClusterWith(t, s, 2, 2, func(*cluster) []string {
		// The rate limit on (it talks to Redis too) but never reached.
		return []string{"REDIS_URL=" + ss.url(), "CLEANUP_SCHEDULE=@every 1s", "ORG_START_RATE=100000"}
	})
	rec := &recorder{}
	cl := newClient(c.baseURLs(), rec, s.cfg.MaxBodyBytes)
	t.Cleanup(cl.close)
	o := c.newOrg("sentinel")
	slow, cheap := slowWorkflow(), orderWorkflow()
	slowID := createWorkflow(t, cl, o, slow)
	cheapID := createWorkflow(t, cl, o, cheap)
	// 48 slow starts from 8 clients: 24 from 4 came, under -race on two
	// busy cores, no faster than the workers' 4 slots ran them, and no run
	// ever waited in Redis (as redis_restart's once did).
	slowOps := makeOps("sentinel-slow", 48, o, slowID, slow)
	cheapOps := makeOps("sentinel", 160, o, cheapID, cheap)
	ctx := context.Background()

	mc := ss.master.client()
	defer mc.Close()
	ins := asynq.NewInspectorFromRedisClient(mc)
	pending := func() int { return runsWaitingInRedis(ctx, ins, mc) }
	ls := startLoad(ctx, cl, slowOps, 8)
	if !waitUntil(time.Minute, func() bool { return pending() >= 4 }) {
		t.Fatalf("no run ever waited in Redis, in the queue or at the gate (%d)", pending())
	}
	lc := startLoad(ctx, cl, cheapOps, 6)
	if !waitUntil(30*time.Second, func() bool { return lc.done.Load() >= 20 }) {
		t.Fatalf("the load did not get going before the failover: %d operations done", lc.done.Load())
	}
	cleanupsBefore := workerCounter(c, `valruns_tasks_processed_total{type="`+tasks.TypeCleanup+`"}`)
	redeliveredBefore := workerCounter(c, "valruns_runs_redelivered_total")

	// Writes the replica never gets: it is stopped while the load goes on,
	// and so are the workers, so that the runs started meanwhile wait in
	// the master alone (their tasks or their places at the gate).
	ss.replica.proc.signal(syscall.SIGSTOP)
	for _, w := range c.workers {
		w.signal(syscall.SIGSTOP)
	}
	// The replication stream so far is in the stopped replica's socket
	// buffer, which it reads when it goes on: the master drops the link, so
	// that what it writes from now on is its own.
	if err := mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatalf("drop the replica's link: %v", err)
	}
	doneAtStop := lc.done.Load()
	waitUntil(5*time.Second, func() bool { return lc.done.Load() >= doneAtStop+10 })
	inRedis := pending()
	faultAt := time.Now()
	ss.master.proc.kill()
	ss.replica.proc.signal(syscall.SIGCONT)
	for _, w := range c.workers {
		w.signal(syscall.SIGCONT)
	}
	_ = ins.Close()
	if !waitUntil(60*time.Second, func() bool { return ss.masterAddr() == ss.replica.addr() }) {
		t.Fatalf("Sentinel did not promote the replica within 60 s (master now %q)", ss.masterAddr())
	}
	promotedAt := time.Now()
	t.Logf("master killed with %d runs waiting in it (%d starts answered while the replica was stopped); replica promoted after %s",
		inRedis, lc.done.Load()-doneAtStop, promotedAt.Sub(faultAt).Round(time.Millisecond))

	ls.wait()
	lc.wait()
	verify(t, c, res, append(slowOps, cheapOps...), expectations{faultAt: faultAt})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)

	// The tasks lost with the old master came back through the sweeper.
	if redelivered := workerCounter(c, "valruns_runs_redelivered_total") - redeliveredBefore; redelivered == 0 {
		res.fail(t, "no run was redelivered by the sweeper after the failover: the runs whose tasks the old master took along were not recovered, or none was lost (the scenario proved nothing)")
	} else {
		res.Figures = append(res.Figures, fmt.Sprintf("%d runs redelivered by the sweeper after the failover (their tasks were lost with the old master, or looked so)", redelivered))
	}

	// The scheduler goes on: cleanups after the promotion, once per tick.
	from := workerCounter(c, `valruns_tasks_processed_total{type="`+tasks.TypeCleanup+`"}`)
	window := 5 * time.Second
	time.Sleep(window)
	ran := workerCounter(c, `valruns_tasks_processed_total{type="`+tasks.TypeCleanup+`"}`) - from
	ticks := int64(window / time.Second)
	if ran < 2 || ran > ticks+1 {
		res.fail(t, "the cleanup ran %d times in %s after the promotion with CLEANUP_SCHEDULE=@every 1s, want about %d (once per tick)", ran, window, ticks)
	}
	res.Figures = append(res.Figures, fmt.Sprintf("Sentinel promoted the replica %.1f s after the master's kill -9; the cleanup ran %d times before the failover and %d times in the %s window after it (one per tick: %d)",
		promotedAt.Sub(faultAt).Seconds(), cleanupsBefore, ran, window, ticks))
}
