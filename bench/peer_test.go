package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/proctest"
	"github.com/valruns/valruns/internal/testdb"
)

// TestPeerStartsAndReplays: the peer the benchmark compares with does what
// its rows claim: a start inserts one run into validation_runs and answers
// 201; a retry with the same Idempotency-Key answers the stored 201 and
// inserts nothing.
func TestPeerStartsAndReplays(t *testing.T) {
	t.Parallel()
	peerDir, err := filepath.Abs("peer")
	require.NoError(t, err)
	needTool(t, "peer") // node, npm and the peer's packages
	needTool(t, "redis-server")
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

	port := proctest.FreePort(t)
	peer, err := startProc("peer", logDir, peerDir, childEnv("PORT="+strconv.Itoa(port), "HOST=127.0.0.1",
		"DATABASE_URL="+dbURL, fmt.Sprintf("REDIS_URL=redis://127.0.0.1:%d/0", rport), "ORG_ID="+org), "node", "server.js")
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
}
