package models_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm/schema"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// A delivery whose lease ran out writes nothing, whether or not another
// delivery has claimed the run yet: its worker may have been stopped for any
// time, and the sweeper may have re-enqueued the run. A heartbeat does not
// revive the lease; Finish, FailAttempt and Release change nothing. The run
// is then claimed afresh and finished by its new delivery, once.
func TestExpiredLeaseFencesEveryWrite(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	runs := models.NewRunStore(db)
	var id string
	org, wf := acmeWorkflow(t, db)
	require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, status, submission, metadata)
		VALUES (?, ?, 'queued', '{}', '{}') RETURNING id`, org, wf).Scan(&id).Error)

	type row struct {
		Status         string
		Attempts       int
		LeaseExpiresAt *time.Time
		Error          *string
		Findings       int
	}
	read := func() row {
		t.Helper()
		var r row
		require.NoError(t, db.Raw(`SELECT status, attempts, lease_expires_at, error,
			coalesce(json_array_length(r.findings), 0) AS findings
			FROM validation_runs r WHERE id = ?`, id).Scan(&r).Error)
		return r
	}
	stale, err := runs.Claim(ctx, id, time.Minute, 5)
	require.NoError(t, err)
	// A live lease: the delivery's writes go through.
	owned, err := runs.Heartbeat(ctx, id, stale.Attempts, time.Minute)
	require.NoError(t, err)
	require.True(t, owned, "a live lease is renewed")

	// The delivery's worker is stopped past its lease.
	require.NoError(t, db.Exec(`UPDATE validation_runs SET lease_expires_at = clock_timestamp() - interval '1 second'
		WHERE id = ?`, id).Error)
	expired := read()

	owned, err = runs.Heartbeat(ctx, id, stale.Attempts, time.Minute)
	require.NoError(t, err)
	require.False(t, owned, "a heartbeat revived an expired lease")
	ended, err := runs.FailAttempt(ctx, id, stale.Attempts, "schema validation took too long")
	require.NoError(t, err)
	require.False(t, ended, "a delivery with an expired lease ended the run in error")
	require.NoError(t, runs.Release(ctx, id, stale.Attempts))
	owned, err = runs.Finish(ctx, id, stale.Attempts, models.RunFailed,
		[]models.Finding{{Step: "schema", Severity: "error", Message: "stale"}})
	require.NoError(t, err)
	require.False(t, owned, "a delivery with an expired lease finished the run")
	require.Equal(t, expired, read(), "the stale delivery wrote to the run")

	// The next delivery takes it over and finishes it; the stale one still writes nothing.
	fresh, err := runs.Claim(ctx, id, time.Minute, 5)
	require.NoError(t, err)
	require.Equal(t, stale.Attempts+1, fresh.Attempts)
	ended, err = runs.FailAttempt(ctx, id, stale.Attempts, "stale")
	require.NoError(t, err)
	require.False(t, ended)
	owned, err = runs.Finish(ctx, id, fresh.Attempts, models.RunPassed, nil)
	require.NoError(t, err)
	require.True(t, owned)
	got := read()
	require.Equal(t, models.RunPassed, got.Status)
	require.Nil(t, got.Error)
	require.Zero(t, got.Findings)
}

// FinishUnclaimed never scans the runs. No index of runs holds status, so
// a plan made while the table was nearly empty scans the table whole;
// cached on a connection (after five executions, PostgreSQL keeps a
// generic plan), it went on doing so for every batch as the table grew.
// The statement is planned with sequential scans off. Here one connection
// ends runs on a nearly empty table, then one more once the table holds
// 20,000 runs: that one must read them through the primary key, not scan
// them (plan it with enable_seqscan on, and this fails).
func TestFinishUnclaimedNeverScansTheRuns(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1) // one connection: the one whose cache counts
	ctx := context.Background()
	runs := models.NewRunStore(db)
	org, wf := acmeWorkflow(t, db)
	queue := func(n int) (ids []string) {
		t.Helper()
		require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, status, submission)
			SELECT ?, ?, 'queued', '{}' FROM generate_series(1, ?) RETURNING id`, org, wf, n).Scan(&ids).Error)
		return ids
	}
	finish := func(id string) {
		t.Helper()
		ended, err := runs.FinishUnclaimed(ctx, []models.Outcome{{RunID: id, Status: models.RunPassed, StartedAt: time.Now()}})
		require.NoError(t, err)
		require.True(t, ended[id])
	}
	for _, id := range queue(8) {
		finish(id)
	}
	last := queue(20000)[0]
	scanned := func() (n int64) {
		t.Helper()
		// This connection's counts, flushed at the end of the statement.
		require.NoError(t, db.Exec(`SELECT pg_stat_force_next_flush()`).Error)
		require.NoError(t, db.Raw(`SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables WHERE relname = 'validation_runs'`).Scan(&n).Error)
		return n
	}
	before := scanned()
	finish(last)
	require.Less(t, scanned()-before, int64(1000), "ending one run must not scan the runs")
}

// GORM can map every struct the store scans rows into: a field it cannot
// map is logged as an error on every scan ("failed to parse field"), and a
// worker's redeliveries read QueuedRun often.
func TestScannedStructsParse(t *testing.T) {
	for _, v := range []any{&models.QueuedRun{}, &models.ValidationRun{}} {
		_, err := schema.Parse(v, &sync.Map{}, schema.NamingStrategy{})
		require.NoError(t, err, "%T", v)
	}
}
