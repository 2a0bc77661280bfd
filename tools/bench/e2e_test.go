package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
)

// loop is a measured loop whose client-felt start to final is p50 and p99
// and its timestamps' 1 ms less.
func loop(mode e2eMode, clients, started, finished int, p50, p99 time.Duration) e2eResult {
	return e2eResult{Mode: mode.Name, Clients: clients, Window: 10 * time.Second, Started: started, Finished: finished,
		Final: started, FinalP50: p50 - time.Millisecond, FinalP99: p99 - time.Millisecond,
		WaitFinal: started, WaitP50: p50, WaitP99: p99}
}

func e2eResults() *results {
	ms := time.Millisecond
	return &results{E2ETiming: timing{Warm: time.Second, Dur: 5 * time.Second}, E2E: []e2eResult{
		// 1 client: no ratio target; finished 0.94x started is a MISS; p50 equal, p99 2x: PASS.
		loop(modeInline, 1, 1000, 940, 5*ms, 20*ms), loop(peerInline, 1, 2000, 2000, 5*ms, 10*ms),
		loop(modeSeparate, 1, 1000, 1000, 4*ms, 21*ms), loop(peerSeparate, 1, 1000, 1000, 5*ms, 10*ms),
		// 8 clients: 1.5x the peer; 1.49x.
		loop(modeInline, 8, 3000, 3000, 6*ms, 12*ms), loop(peerInline, 8, 2000, 2000, 5*ms, 10*ms),
		loop(modeSeparate, 8, 2980, 2980, 5*ms, 10*ms), loop(peerSeparate, 8, 2000, 2000, 5*ms, 10*ms),
		// 32 clients: a failed peer.
		loop(modeInline, 32, 4000, 4000, 6*ms, 12*ms), {Mode: peerInline.Name, Clients: 32, Failed: "boom"},
	}}
}

// TestE2EChecks: finished/s >= 1.5x the peer at 8 and 32 and finished >=
// 0.95x started at every count; the client-felt start to final p50 <= the
// peer's and p99 <= 2x at 1, 8 and 32; a loop missing or failed is "not
// measured".
func TestE2EChecks(t *testing.T) {
	t.Parallel()
	got := byName(e2eResults().e2eChecks())
	in, sep := pairLabel(e2ePairs[0]), pairLabel(e2ePairs[1])
	want := map[string]string{
		"e2e runs finished/s, " + in + ", 1 client":      "MISS", // finished 0.94x started
		"e2e runs finished/s, " + sep + ", 1 client":     "PASS",
		"e2e runs finished/s, " + in + ", 8 clients":     "PASS", // 1.50x
		"e2e runs finished/s, " + sep + ", 8 clients":    "MISS", // 1.49x
		"e2e start-to-final p50, " + in + ", 1 client":   "PASS", // equal
		"e2e start-to-final p50, " + in + ", 8 clients":  "MISS", // 6 > 5 ms
		"e2e start-to-final p99, " + in + ", 1 client":   "PASS", // 2.00x
		"e2e start-to-final p99, " + sep + ", 1 client":  "MISS", // 2.10x
		"e2e start-to-final p99, " + sep + ", 8 clients": "PASS",
		"e2e runs finished/s, " + in + ", 32 clients":    "not measured",
		"e2e start-to-final p99, " + in + ", 32 clients": "not measured",
		"e2e runs finished/s, " + sep + ", 128 clients":  "not measured",
	}
	require.Len(t, got, 2*4+2*2*3) // finished/s at 1, 8, 32, 128; latencies at 1, 8, 32; both pairs
	for name, res := range want {
		require.Equal(t, res, got[name].result(), "%s: %s", name, got[name].Measured)
	}
	require.Equal(t, "1.50x (300 / 200 runs/s), finished / started 1.00", got["e2e runs finished/s, "+in+", 8 clients"].Measured)
	require.Equal(t, "2.10x (21.0 / 10.0 ms)", got["e2e start-to-final p99, "+sep+", 1 client"].Measured)

	// The targets judge the client's wait, not the runs' own timestamps:
	// without it a loop is not measured, never a 0 ms PASS.
	r := e2eResults()
	r.E2E[4].FinalP50, r.E2E[4].WaitFinal = time.Microsecond, 0
	require.Equal(t, "not measured", byName(r.e2eChecks())["e2e start-to-final p50, "+in+", 8 clients"].result())
}

// TestE2ESection: the targets, and a row per loop.
func TestE2ESection(t *testing.T) {
	t.Parallel()
	s := e2eResults().e2eSection()
	in := pairLabel(e2ePairs[0])
	for _, want := range []string{
		"| 8 | serve --worker | 300 | 1.00 | 6.0 / 12.0 | 5.0 | 0 |",
		"| 32 | peer, one process | FAILED: boom | | | | |",
		"| e2e runs finished/s, " + in + ", 8 clients | 1.50x (300 / 200 runs/s), finished / started 1.00 | >= 1.5x the peer, finished >= 0.95x started | PASS |",
	} {
		require.Contains(t, s.text(&results{}), want)
	}
	require.Len(t, s.Checks, 20)
}

// TestE2ETimesFromTimestamps: start-to-final comes from the runs' own
// columns, over the runs created inside the window only (of one
// organisation when asked), and the client-felt wait from the requests'
// send times; runs not final yet are counted apart.
func TestE2ETimesFromTimestamps(t *testing.T) {
	t.Parallel()
	db, url := testdb.New(t)
	var org, other, wf string
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('e2e', 'e2e') RETURNING id`).Scan(&org).Error)
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('other', 'other') RETURNING id`).Scan(&other).Error)
	require.NoError(t, db.Raw(`INSERT INTO workflows (org_id, name) VALUES (?, 'e2e') RETURNING id`, org).Scan(&wf).Error)
	from := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	to := from.Add(10 * time.Second)
	add := func(org string, created time.Time, run, final time.Duration) (id string) {
		status, started, finished := "queued", any(nil), any(nil)
		if run >= 0 {
			status, started = "running", created.Add(run)
		}
		if final >= 0 {
			status, finished = "passed", created.Add(final)
		}
		require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, submission, status, created_at, started_at, finished_at)
			VALUES (?, ?, '{}', ?, ?, ?, ?) RETURNING id`, org, wf, status, created, started, finished).Scan(&id).Error)
		return id
	}
	for i := range 100 { // finals of 10, 20, ..., 1000 ms; running after i ms
		add(org, from.Add(time.Duration(i)*50*time.Millisecond), time.Duration(i)*time.Millisecond, time.Duration(i+1)*10*time.Millisecond)
	}
	add(org, from.Add(9*time.Second), 5*time.Millisecond, -1) // running, not final
	queued := add(org, from.Add(9*time.Second), -1, -1)       // still queued
	add(org, from.Add(-time.Second), 0, time.Hour)            // created before the window: not counted
	add(org, to, 0, time.Hour)                                // created at the window's end: not counted
	final := add(other, from, 0, time.Hour)                   // another organisation's

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var mine, all e2eResult
	require.NoError(t, e2eTimes(ctx, conn, from, to, org, 0, &mine)) // no wait: two runs are not final
	require.Equal(t, 100, mine.Final)
	require.Equal(t, 2, mine.Unfinished)
	require.Equal(t, 500*time.Millisecond, mine.FinalP50.Round(time.Millisecond))
	require.Equal(t, 990*time.Millisecond, mine.FinalP99.Round(time.Millisecond))
	require.NoError(t, e2eTimes(ctx, conn, from, to, "", 0, &all))
	require.Equal(t, 101, all.Final)
	var theirs e2eResult
	require.NoError(t, e2eTimes(ctx, conn, from, to, other, time.Hour, &theirs), "the other's one run is final: no wait")
	require.Equal(t, e2eResult{Final: 1, FinalP50: time.Hour, FinalP99: time.Hour}, theirs)

	// The client-felt wait: from each request sent to its run's
	// finished_at, over the runs final; the others are counted.
	sent := []sentRun{{ID: final, Sent: from.Add(time.Hour - 10*time.Millisecond)}, {ID: queued, Sent: from}}
	for i := range 100 { // waits of 10, 20, ..., 1000 ms
		created := from.Add(time.Duration(i) * time.Second)
		sent = append(sent, sentRun{ID: add(other, created, 0, time.Duration(i+1)*10*time.Millisecond), Sent: created})
	}
	var w e2eResult
	finished, err := finishedAt(ctx, conn, sent)
	require.NoError(t, err)
	waitTimes(sent, finished, &w)
	require.Equal(t, e2eResult{WaitFinal: 101, WaitUnfinished: 1, WaitP50: 500 * time.Millisecond, WaitP99: 990 * time.Millisecond}, w)
	require.Equal(t, "500.0 / 990.0", waitCell(w))
	require.Equal(t, "-", waitCell(e2eResult{}))
}

// TestLoopClientKeepsStarts: without the long poll, each start's answer
// names its run, kept with its send time when the answer fell in the
// window; an answer naming no run is counted.
func TestLoopClientKeepsStarts(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var c loopClient
	c.follow(answer{Status: http.StatusCreated, Sent: at, Answered: at, Body: []byte(`{"id":"w","status":"queued"}`)}, false) // the warm-up's
	c.follow(answer{Status: http.StatusCreated, Sent: at, Answered: at, Body: []byte(`{"id":"5b0f","status":"queued"}`), InWindow: true}, false)
	require.Empty(t, c.run.ID, "the next request is a start")
	c.follow(answer{Status: http.StatusCreated, Sent: at, Body: []byte(`{}`), InWindow: true}, false)
	require.Equal(t, []sentRun{{ID: "5b0f", Sent: at, Answered: at}}, c.done)
	require.Equal(t, 1, c.noRun)
}
