package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/testdb"
)

// TestPeerStartsAndReplays: the peer the benchmark compares with does what
// its rows claim: a start inserts one run into validation_runs, adds its
// BullMQ job (none with PEER_ENQUEUE=0) and answers 201; a retry with the
// same Idempotency-Key answers the stored 201 and inserts nothing.
func TestPeerStartsAndReplays(t *testing.T) {
	t.Parallel()
	needTool(t, "peer") // node, npm and the peer's packages
	needTool(t, "redis-server")
	for _, enqueue := range []bool{true, false} {
		t.Run(map[bool]string{true: "enqueue", false: "PEER_ENQUEUE=0"}[enqueue], func(t *testing.T) {
			t.Parallel()
			peerStartsAndReplays(t, enqueue)
		})
	}
}

func peerStartsAndReplays(t *testing.T, enqueue bool) {
	peerDir, err := filepath.Abs("peer")
	require.NoError(t, err)
	ctx := context.Background()
	db, dbURL := testdb.New(t)
	var org, wf string
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('peer', 'peer') RETURNING id`).Scan(&org).Error)
	require.NoError(t, db.Raw(`INSERT INTO workflows (org_id, name) VALUES (?, 'peer') RETURNING id`, org).Scan(&wf).Error)
	runs := func() int {
		var n int
		require.NoError(t, db.Raw(`SELECT count(*) FROM validation_runs`).Scan(&n).Error)
		return n
	}

	logDir := t.TempDir()
	rport := proctest.FreePort(t)
	redis, err := startProc("redis", logDir, logDir, childEnv(), "redis-server", "--port", strconv.Itoa(rport),
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", logDir)
	require.NoError(t, err)
	t.Cleanup(func() { redis.Stop(5 * time.Second) })
	rdb := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", rport)})
	t.Cleanup(func() { _ = rdb.Close() })

	port := proctest.FreePort(t)
	kv := []string{"PORT=" + strconv.Itoa(port), "HOST=127.0.0.1", "DATABASE_URL=" + dbURL, fmt.Sprintf("REDIS_URL=redis://127.0.0.1:%d/0", rport), "ORG_ID=" + org}
	if !enqueue {
		kv = append(kv, "PEER_ENQUEUE=0")
	}
	peer, err := startProc("peer", logDir, peerDir, childEnv(kv...), "node", "server.js")
	require.NoError(t, err)
	t.Cleanup(func() { peer.Stop(5 * time.Second) })
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	require.NoError(t, peer.waitHTTP(base+"/healthz", 30*time.Second))

	post := func(key string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/workflows/"+wf+"/start/", strings.NewReader(startBody))
		require.NoError(t, err)
		req.Header = headerFor("", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	status, body := post("")
	require.Equal(t, http.StatusCreated, status, body)
	require.Contains(t, body, `"status":"queued"`)
	require.Equal(t, 1, runs())

	status, first := post("k-1")
	require.Equal(t, http.StatusCreated, status, first)
	require.Equal(t, 2, runs())
	// express-idempotency stores the answer after sending it: wait for it.
	require.Eventually(t, func() bool {
		status, again := post("k-1")
		return status == http.StatusCreated && again == first
	}, 5*time.Second, 20*time.Millisecond)
	for range 3 {
		status, again := post("k-1")
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, first, again)
	}
	require.Equal(t, 2, runs(), "replays inserted nothing")
	jobs, err := rdb.LLen(ctx, "bull:runs:wait").Result() // no worker takes them
	require.NoError(t, err)
	require.EqualValues(t, map[bool]int{true: 2, false: 0}[enqueue], jobs, "a job per run inserted, or none")
}

// TestPeerWorkerWritesTheResult: the peer end to end does what its rows
// claim: the start enqueues a BullMQ job after its INSERT, and the worker
// (in the server's process, or as worker.js) validates the submission with
// ajv against the workflow's JSON Schema and writes the run's status, times
// and findings; a read with Prefer: wait answers the run final.
func TestPeerWorkerWritesTheResult(t *testing.T) {
	t.Parallel()
	peerDir, err := filepath.Abs("peer")
	require.NoError(t, err)
	needTool(t, "peer")
	needTool(t, "redis-server")
	for _, separate := range []bool{false, true} {
		t.Run(map[bool]string{false: "one process", true: "worker.js"}[separate], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, dbURL := testdb.New(t)
			var org, wf string
			require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('peer', 'peer') RETURNING id`).Scan(&org).Error)
			require.NoError(t, db.Raw(`INSERT INTO workflows (org_id, name, schema) VALUES (?, 'peer',
				'{"type":"object","required":["customer","total"],"properties":{"total":{"type":"number"}}}') RETURNING id`, org).Scan(&wf).Error)

			logDir := t.TempDir()
			rport := proctest.FreePort(t)
			redis, err := startProc("redis", logDir, logDir, childEnv(), "redis-server", "--port", strconv.Itoa(rport),
				"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", logDir)
			require.NoError(t, err)
			t.Cleanup(func() { redis.Stop(5 * time.Second) })
			redisURL := fmt.Sprintf("redis://127.0.0.1:%d/0", rport)

			port := proctest.FreePort(t)
			kv := []string{"PORT=" + strconv.Itoa(port), "HOST=127.0.0.1", "DATABASE_URL=" + dbURL, "REDIS_URL=" + redisURL, "ORG_ID=" + org}
			if !separate {
				kv = append(kv, "PEER_WORKER=1")
			}
			peer, err := startProc("peer", logDir, peerDir, childEnv(kv...), "node", "server.js")
			require.NoError(t, err)
			t.Cleanup(func() { peer.Stop(5 * time.Second) })
			base := fmt.Sprintf("http://127.0.0.1:%d", port)
			require.NoError(t, peer.waitHTTP(base+"/healthz", 30*time.Second))
			if separate {
				hport := proctest.FreePort(t)
				w, err := startProc("peer-worker", logDir, peerDir, childEnv("HEALTH_PORT="+strconv.Itoa(hport), "HOST=127.0.0.1",
					"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL), "node", "worker.js")
				require.NoError(t, err)
				t.Cleanup(func() { w.Stop(5 * time.Second) })
				require.NoError(t, w.waitHTTP(fmt.Sprintf("http://127.0.0.1:%d/healthz", hport), 30*time.Second))
			}

			start := func(body string) string {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/workflows/"+wf+"/start/", strings.NewReader(body))
				require.NoError(t, err)
				req.Header = headerFor("", "")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				b, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				_ = resp.Body.Close()
				require.Equal(t, http.StatusCreated, resp.StatusCode, string(b))
				var run struct{ ID string }
				require.NoError(t, json.Unmarshal(b, &run))
				return run.ID
			}
			good := start(startBody)
			bad := start(`{"submission":{"total":"forty-two"}}`)
			type final struct {
				Status   string
				Started  bool
				Finished bool
				Findings int
			}
			read := func(id string) final {
				var f final
				require.NoError(t, db.Raw(`SELECT status, started_at IS NOT NULL AS started, finished_at IS NOT NULL AS finished,
					coalesce(json_array_length(r.findings), 0) AS findings FROM validation_runs r WHERE id = ?`, id).Scan(&f).Error)
				return f
			}
			// The long poll: a read with Prefer: wait answers once the job is
			// done (its row final), however soon it came.
			for id, want := range map[string]string{bad: "failed", good: "passed"} {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/runs/"+id+"/", nil)
				require.NoError(t, err)
				req.Header.Set("Prefer", "wait=20")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				var run struct{ ID, Status string }
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&run))
				_ = resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Equal(t, id, run.ID)
				require.Equal(t, want, run.Status, "peer log:\n%s", peer.Tail())
			}
			require.Eventually(t, func() bool { return read(good).Finished && read(bad).Finished }, 20*time.Second, 50*time.Millisecond,
				"the worker never finished the runs; peer log:\n%s", peer.Tail())
			require.Equal(t, final{Status: "passed", Started: true, Finished: true}, read(good))
			require.Equal(t, final{Status: "failed", Started: true, Finished: true, Findings: 2}, read(bad)) // customer missing, total not a number
		})
	}
}
