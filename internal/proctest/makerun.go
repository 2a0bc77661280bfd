package proctest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/internal/testredis"
)

// Result is what one run of the binary produced.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Exec runs the built binary with args, the environment env (added to a
// clean one, see Env) and stdin, and returns its exit code and output.
func Exec(t testing.TB, bin string, env []string, stdin string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = Env(env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return Result{Code: code, Stdout: out.String(), Stderr: errOut.String()}
}

// ExitedChild tells WaitHTTP whether a child process has exited, and shows
// its output if it has.
func ExitedChild(exited <-chan struct{}, log *Log) func() (string, bool) {
	return func() (string, bool) {
		select {
		case <-exited:
			return log.String(), true
		default:
			return "", false
		}
	}
}

// redisQueue serialises the services MakeRun starts: their workers share
// RedisURL's queue.
var redisQueue sync.Mutex

// LockRedis gives the test RedisURL's queue alone until it ends, so that
// no other test's worker (MakeRun's, say) takes its tasks; call it before
// starting processes (its cleanup then runs after they have stopped).
func LockRedis(t *testing.T) {
	t.Helper()
	redisQueue.Lock()
	t.Cleanup(redisQueue.Unlock)
}

// MakeRun is the service as `make run` starts it: `valruns serve --worker`
// with MIGRATE_ON_START=true on a fresh empty database, then `valruns
// demo`, which keeps the demo token in dir/.dev/demo-token. The worker
// really validates runs (Redis: RedisURL). It returns the database,
// the API's address and the demo's token and workflow id; the service
// stops when the test ends.
func MakeRun(t *testing.T, bin, dir string) (db *gorm.DB, addr, token, wf string) {
	t.Helper()
	// One such service at a time: they share RedisURL's queue, and a
	// worker drops a task whose run is in another test's database (the run
	// then waits for a sweeper to redeliver it).
	LockRedis(t)
	db, dbURL := testdb.New(t, testdb.Options{Empty: true, MaxOpenConns: 2})
	addr = FreeAddr(t)
	apiURL := "http://" + addr
	serverEnv := []string{"DATABASE_URL=" + dbURL, "REDIS_URL=" + RedisURL(), "HTTP_ADDR=" + addr,
		"MIGRATE_ON_START=true", "LOG_FORMAT=json", "LOG_LEVEL=warn", "WORKER_CONCURRENCY=2",
		"ORG_START_RATE="} // as make run runs it: the documented default rate
	log := &Log{}
	srv := exec.Command(bin, "serve", "--worker")
	srv.Env = Env(serverEnv...)
	srv.Stdout, srv.Stderr = log, log
	require.NoError(t, srv.Start())
	exited := make(chan struct{})
	go func() { _ = srv.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = srv.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = srv.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("valruns serve --worker output:\n%s", log.String())
		}
	})
	WaitHTTP(t, apiURL+"/readyz", ExitedChild(exited, log))

	demo := Exec(t, bin, []string{"DATABASE_URL=" + dbURL}, "", "demo", "--token-file", filepath.Join(dir, ".dev", "demo-token"))
	require.Equal(t, 0, demo.Code, demo.Stderr)
	vars := map[string]string{}
	for _, line := range strings.Fields(demo.Stdout) {
		k, v, _ := strings.Cut(line, "=")
		vars[k] = v
	}
	token, wf = vars["DEMO_TOKEN"], vars["DEMO_WORKFLOW"]
	require.NotEmpty(t, token)
	require.NotEmpty(t, wf)
	return db, addr, token, wf
}

// RedisURL is TEST_REDIS_URL (internal/testredis.MustURL).
func RedisURL() string { return testredis.MustURL() }
