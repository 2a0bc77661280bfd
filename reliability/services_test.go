package reliability

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/valruns/valruns/internal/proctest"
)

// Port ranges reserved for this suite on the shared machine (the system
// PostgreSQL and Redis are on 5432 and 6379 and are never touched).
const (
	pgPortFirst, pgPortLast       = 55440, 55449
	redisPortFirst, redisPortLast = 6394, 6399
)

// child is a process the suite started, in a process group of its own so
// that a kill reaches everything it forked. Pdeathsig kills it if the test
// binary itself dies (a panic or a go test timeout skips t.Cleanup).
type child struct {
	name string
	cmd  *exec.Cmd
	log  *proctest.Log
	done chan struct{}
}

func startChild(name, path string, args, env []string, cred *syscall.Credential, dir string) (*child, error) {
	c := &child{name: name, log: &proctest.Log{}, done: make(chan struct{})}
	c.cmd = exec.Command(path, args...)
	c.cmd.Env = env
	c.cmd.Dir = dir
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the child's whole process group.
func (c *child) signal(sig syscall.Signal) {
	if !c.exited() {
		_ = syscall.Kill(-c.cmd.Process.Pid, sig)
	}
}

// isStopped reports whether the child is stopped (SIGSTOP): state T in
// /proc/PID/stat.
func (c *child) isStopped() bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.pid()))
	_, after, _ := strings.Cut(string(stat), ") ")
	return err == nil && strings.HasPrefix(after, "T")
}

// kill is `kill -9` of the process group; it returns once the child is gone.
func (c *child) kill() {
	c.signal(syscall.SIGKILL)
	<-c.done
}

// stop sends sig and waits up to grace for the child to exit, then kills it.
func (c *child) stop(sig syscall.Signal, grace time.Duration) {
	c.signal(sig)
	select {
	case <-c.done:
	case <-time.After(grace):
		c.kill()
	}
}

// tail is the last n lines of the child's output.
func (c *child) tail(n int) string {
	lines := strings.Split(strings.TrimRight(c.log.String(), "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d earlier lines)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// freePortIn returns the first port of [first, last] that no other run of
// this suite holds and nothing listens on. A run holds its ports for as
// long as it lives by a lock (flock) on a file per port in the temporary
// directory, released when the test binary ends however it ends: a port
// whose server is down for a restart (postgres_restart, redis_restart) is
// still taken, so a second run started meanwhile (make reliability beside
// make test) does not start its own server there.
//
// RELIABILITY_PORTS=FIRST-LAST, when set, replaces every range (and the
// API replicas' and workers' ports, see freeAddr): on a machine shared
// with others, every port the suite opens is then in that one range.
func freePortIn(t testing.TB, first, last int, what string) int {
	t.Helper()
	if f, l, ok := portsOverride(t); ok {
		first, last = f, l
	}
	for p := first; p <= last; p++ {
		lock, err := os.OpenFile(filepath.Join(os.TempDir(), fmt.Sprintf("valruns-reliability-port-%d.lock", p)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			continue
		}
		if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			_ = lock.Close() // another run's
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			_ = lock.Close()
			continue
		}
		_ = ln.Close()
		t.Cleanup(func() { _ = lock.Close() })
		return p
	}
	t.Fatalf("no free port for the private %s in %d-%d (another run of this suite?)", what, first, last)
	return 0
}

// portsOverride is RELIABILITY_PORTS's range, ok false when it is unset.
func portsOverride(t testing.TB) (first, last int, ok bool) {
	v := os.Getenv("RELIABILITY_PORTS")
	if v == "" {
		return 0, 0, false
	}
	a, b, _ := strings.Cut(v, "-")
	first, err1 := strconv.Atoi(a)
	last, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || first <= 0 || last < first || last > 65535 {
		t.Fatalf("RELIABILITY_PORTS=%q: want FIRST-LAST, such as 25400-25599", v)
	}
	return first, last, true
}

// freeAddr is a loopback address for a valruns child to listen on: any
// free port, or one of RELIABILITY_PORTS's when it is set.
func freeAddr(t testing.TB) string {
	t.Helper()
	if first, last, ok := portsOverride(t); ok {
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(freePortIn(t, first, last, "valruns child")))
	}
	return proctest.FreeAddr(t)
}

// installHint is what to install when a server binary is missing.
const installHint = "install the Debian packages postgresql and redis-server (apt-get install postgresql redis-server), or run scripts/dev-services.sh as root, which installs them"

// aptInstall installs packages when running as root, as scripts/dev-services.sh does.
func aptInstall(t testing.TB, pkgs ...string) bool {
	t.Helper()
	if os.Geteuid() != 0 {
		return false
	}
	t.Logf("installing %s with apt-get ...", strings.Join(pkgs, " "))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq"}, pkgs...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("apt-get %s: %v\n%s", strings.Join(args, " "), err, out)
			return false
		}
	}
	return true
}

// pgBinDir finds the newest /usr/lib/postgresql/*/bin with initdb and postgres.
func pgBinDir(t testing.TB) string {
	t.Helper()
	find := func() string {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		slices.SortFunc(dirs, func(a, b string) int {
			va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
			vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
			return vb - va
		})
		for _, d := range dirs {
			if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
				return d
			}
		}
		if p, err := exec.LookPath("initdb"); err == nil && isExec(filepath.Join(filepath.Dir(p), "postgres")) {
			return filepath.Dir(p)
		}
		return ""
	}
	if d := find(); d != "" {
		return d
	}
	if aptInstall(t, "postgresql", "postgresql-client") {
		if d := find(); d != "" {
			return d
		}
	}
	t.Fatalf("the fault suite needs the PostgreSQL server binaries (initdb, postgres under /usr/lib/postgresql/*/bin) to run a private cluster it can restart: %s", installHint)
	return ""
}

func redisBin(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	if aptInstall(t, "redis-server") {
		if p, err := exec.LookPath("redis-server"); err == nil {
			return p
		}
	}
	t.Fatalf("the fault suite needs redis-server to run a private Redis it can restart: %s", installHint)
	return ""
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// pgServer is a private PostgreSQL cluster in a temporary directory, run
// as a child process (postgres -D) so the suite can stop and restart it.
type pgServer struct {
	t    testing.TB
	bin  string
	data string
	port int
	// cred runs the server as the postgres OS user when the suite runs as
	// root (PostgreSQL refuses to run as root).
	cred *syscall.Credential
	proc *child
	logs []string // output of earlier incarnations, for failure reports
}

const pgDirPattern = "valruns-reliability-pg-"

// removeStaleClusters deletes the cluster directories of earlier runs that
// died without their cleanup (a go test timeout, a kill -9): Pdeathsig
// stopped their servers, but not their files. A directory whose postmaster
// still runs, or that is younger than a minute (initdb may be writing it),
// belongs to a live run.
func removeStaleClusters(t testing.TB) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), pgDirPattern+"*"))
	for _, d := range dirs {
		st, err := os.Stat(d)
		if err != nil || time.Since(st.ModTime()) < time.Minute {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(d, "data", "postmaster.pid")); err == nil {
			pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
			if pid > 0 && syscall.Kill(pid, 0) == nil {
				continue
			}
		}
		if err := os.RemoveAll(d); err == nil {
			t.Logf("removed %s, left by an earlier run that did not clean up", d)
		}
	}
}

func startPostgres(t testing.TB) *pgServer {
	t.Helper()
	removeStaleClusters(t)
	s := &pgServer{t: t, bin: pgBinDir(t)}
	dir, err := os.MkdirTemp("", pgDirPattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s.data = filepath.Join(dir, "data")
	if err := os.Mkdir(s.data, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, the private PostgreSQL must run as the postgres OS user, which does not exist: %v (%s)", err, installHint)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for _, p := range []string{dir, s.data} {
			if err := os.Chown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	initdb, err := startChild("initdb", filepath.Join(s.bin, "initdb"),
		[]string{"-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "-D", s.data},
		os.Environ(), s.cred, dir)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-initdb.done:
	case <-time.After(2 * time.Minute):
		initdb.kill()
	}
	if code := initdb.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("initdb failed (exit %d):\n%s", code, initdb.log.String())
	}
	s.port = freePortIn(t, pgPortFirst, pgPortLast, "PostgreSQL")
	t.Cleanup(func() {
		if s.proc != nil {
			s.proc.stop(syscall.SIGQUIT, 10*time.Second)
		}
	})
	s.start()
	return s
}

// url is the connection URL of database db.
func (s *pgServer) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// start runs the server and waits until it accepts connections.
func (s *pgServer) start() {
	s.t.Helper()
	args := []string{"-D", s.data, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		// fsync and full-page writes only matter if the machine itself
		// crashes: off for speed, as in dev-services.sh. Not
		// synchronous_commit: with it off, a commit acknowledged just before
		// an immediate stop is lost, and the suite rightly reports an
		// accepted run that does not exist.
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=64MB"}
	p, err := startChild("postgres", filepath.Join(s.bin, "postgres"), args, os.Environ(), s.cred, s.data)
	if err != nil {
		s.t.Fatal(err)
	}
	s.proc = p
	// A generous bound, not a speed check: beside two busy loops under make
	// test, with the suite's other clusters starting too, a start (crash
	// recovery after stopImmediate) once took more than a minute.
	const startBound = 3 * time.Minute
	deadline := time.Now().Add(startBound)
	for !s.ready() {
		if p.exited() {
			s.t.Fatalf("private PostgreSQL exited while starting:\n%s", p.tail(40))
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("private PostgreSQL on port %d not ready after %s:\n%s", s.port, startBound, p.tail(40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *pgServer) ready() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.url("postgres"))
	if err != nil {
		return false
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx) == nil
}

// stopImmediate is `pg_ctl stop -m immediate`: SIGQUIT to the postmaster,
// every session dies at once, crash recovery runs at the next start.
func (s *pgServer) stopImmediate() {
	s.proc.stop(syscall.SIGQUIT, 30*time.Second)
	s.logs = append(s.logs, s.proc.log.String())
}

// redisServer is a private redis-server without persistence, run as a child
// process so the suite can kill it (losing everything it held) and restart it.
type redisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	proc *child
}

func startRedis(t testing.TB) *redisServer {
	t.Helper()
	s := &redisServer{t: t, bin: redisBin(t), dir: t.TempDir()}
	s.port = freePortIn(t, redisPortFirst, redisPortLast, "Redis")
	t.Cleanup(func() {
		if s.proc != nil {
			s.proc.kill()
		}
	})
	s.start()
	return s
}

func (s *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// url is REDIS_URL for the valruns children.
func (s *redisServer) url() string { return "redis://" + s.addr() + "/0" }

func (s *redisServer) start() {
	s.t.Helper()
	p, err := startChild("redis-server", s.bin, []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--protected-mode", "no", "--daemonize", "no"},
		os.Environ(), nil, s.dir)
	if err != nil {
		s.t.Fatal(err)
	}
	s.proc = p
	deadline := time.Now().Add(30 * time.Second)
	for s.ping() != nil {
		if p.exited() {
			s.t.Fatalf("private Redis exited while starting:\n%s", p.tail(40))
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("private Redis on port %d not ready after 30s: %v", s.port, s.ping())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *redisServer) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.addr(), DialTimeout: 2 * time.Second})
}

func (s *redisServer) ping() error {
	c := s.client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// flush empties the private Redis between scenarios (it is ours alone).
func (s *redisServer) flush() error {
	c := s.client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := c.FlushAll(ctx).Err()
	if err != nil {
		return errors.Join(errors.New("flush private redis"), err)
	}
	return nil
}

// crash is `kill -9` of redis-server: without persistence, everything it
// held (queued and active tasks) is gone.
func (s *redisServer) crash() { s.proc.kill() }

// TestPortHeldWhileDown: a port this run took stays its own while nothing
// listens on it (its server restarting): the next pick is another port.
func TestPortHeldWhileDown(t *testing.T) {
	first := freePortIn(t, pgPortFirst, pgPortLast, "PostgreSQL")
	second := freePortIn(t, pgPortFirst, pgPortLast, "PostgreSQL")
	if first == second {
		t.Fatalf("port %d was handed out twice", first)
	}
}
