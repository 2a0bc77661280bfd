package models_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// keyWrite is a finished key row for a start.
func keyWrite(org, key string) *idempotency.Key {
	return &idempotency.Key{Tenant: org, Scope: "workflow_start", Key: key, LockID: idempotency.LockID(org, "workflow_start", key),
		RequestHash: make([]byte, 32), Method: "POST", Path: "/p", Status: 201, Body: []byte(`{"answer":"` + key + `"}`),
		Headers: []byte(`{}`), RequestID: "req-" + key, TTL: time.Hour}
}

func (f *usageFixture) params(org, wf string, quota int64) models.StartParams {
	return models.StartParams{ID: models.NewRunID(), CreatedAt: f.now, OrgID: org, WorkflowID: wf,
		Submission: []byte(`{"n":1}`), Quota: quota, RequestID: "req"}
}

// One statement decides every kind of start at once: new keys and no key
// commit their runs and key rows, a live key answers with its stored row,
// a key locked elsewhere is in flight, an unknown workflow and starts that
// do not fit their organisation's usage slots go to the slow path, and
// only what committed is billed.
func TestStartBatchDecidesEachStart(t *testing.T) {
	t.Parallel()
	f := newUsageFixture(t)
	ctx := context.Background()
	runs := f.runs
	// The first start of the period balances the slots (slow path).
	require.NoError(t, f.startCommitted(t, 0, f.now))
	var small string // an organisation whose quota leaves room for two more runs
	require.NoError(t, f.db.Raw(`INSERT INTO organizations (name, slug) VALUES ('Small', 'small') RETURNING id`).Scan(&small).Error)
	var smallWF string
	require.NoError(t, f.db.Raw(`INSERT INTO workflows (org_id, name) VALUES (?, 'wf') RETURNING id`, small).Scan(&smallWF).Error)
	tx := f.begin(t)
	require.NoError(t, f.runs.Start(tx, models.StartParams{ID: models.NewRunID(), CreatedAt: f.now, OrgID: small, WorkflowID: smallWF,
		Submission: []byte(`{}`), Quota: models.UsageSlots * 2}))
	_, err := tx.Commit(ctx, nil)
	require.NoError(t, err)
	// "live" has a stored answer; "busy" is held by another transaction.
	res, err := runs.StartBatch([]models.StartParams{f.params(f.org, f.wf, 0)}, []*idempotency.Key{keyWrite(f.org, "live")})
	require.NoError(t, err)
	require.Equal(t, idempotency.Committed, res[0].Kind)
	holder, _, err := models.BeginRequest(ctx, f.db, 10*time.Second, &idempotency.Key{Tenant: f.org, Scope: "workflow_start", Key: "busy",
		LockID: idempotency.LockID(f.org, "workflow_start", "busy")})
	require.NoError(t, err)
	require.NotNil(t, holder)
	defer holder.Rollback()
	before := f.usage(t, f.now)

	ps := []models.StartParams{
		f.params(f.org, f.wf, 0),                                   // 0 no key
		f.params(f.org, f.wf, 0),                                   // 1 new key
		f.params(f.org, f.wf, 0),                                   // 2 new key
		f.params(f.org, f.wf, 0),                                   // 3 live key
		f.params(f.org, f.wf, 0),                                   // 4 in flight
		f.params(f.org, "00000000-0000-4000-8000-000000000000", 0), // 5 unknown workflow
		f.params(small, smallWF, models.UsageSlots*2),              // 6, 7, 8: three runs of small: no slot has room for 3
		f.params(small, smallWF, models.UsageSlots*2),
		f.params(small, smallWF, models.UsageSlots*2),
	}
	ks := []*idempotency.Key{nil, keyWrite(f.org, "new-1"), keyWrite(f.org, "new-2"), keyWrite(f.org, "live"),
		keyWrite(f.org, "busy"), keyWrite(f.org, "wf-unknown"), nil, nil, nil}
	res, err = runs.StartBatch(ps, ks)
	require.NoError(t, err)
	for _, i := range []int{0, 1, 2} {
		require.Equal(t, idempotency.Committed, res[i].Kind, "start %d: %+v", i, res[i])
	}
	require.WithinDuration(t, time.Now().Add(time.Hour), res[1].Key.ExpiresAt, 5*time.Minute)
	require.Equal(t, idempotency.KeyAnswered, res[3].Kind, "a live key answers")
	require.Equal(t, `{"answer":"live"}`, string(res[3].Key.Body))
	require.Equal(t, idempotency.KeyInFlight, res[4].Kind, "a key held elsewhere is in flight")
	for _, i := range []int{5, 6, 7, 8} {
		require.Equal(t, idempotency.NotDone, res[i].Kind, "start %d goes to the slow path: %+v", i, res[i])
	}
	require.Equal(t, before+3, f.usage(t, f.now), "three runs billed, once each")
	var n int64
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM validation_runs WHERE id IN ?`, []string{ps[0].ID, ps[1].ID, ps[2].ID}).Scan(&n).Error)
	require.EqualValues(t, 3, n)
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM validation_runs WHERE id IN ?`, []string{ps[3].ID, ps[4].ID, ps[5].ID, ps[6].ID}).Scan(&n).Error)
	require.Zero(t, n, "nothing written for the others")
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM idempotency_keys k JOIN validation_runs r ON r.id = k.validation_run_id
		AND r.idempotency_key = k.key WHERE k.key IN ('new-1', 'new-2')`).Scan(&n).Error)
	require.EqualValues(t, 2, n, "each new key row and its run, linked both ways")
}

// Concurrent statements carrying the same new key, each beside a key of
// its own: the key's lock lets one of them write it (the others see it in
// flight, or its stored row once committed); every other start commits;
// each run is billed once.
func TestStartBatchConcurrentKeyOneRun(t *testing.T) {
	t.Parallel()
	f := newUsageFixture(t)
	require.NoError(t, f.startCommitted(t, 0, f.now))
	var wg sync.WaitGroup
	results := make([][]idempotency.Result, 8)
	errs := make([]error, len(results))
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = f.runs.StartBatch([]models.StartParams{f.params(f.org, f.wf, 0), f.params(f.org, f.wf, 0)},
				[]*idempotency.Key{keyWrite(f.org, "shared"), keyWrite(f.org, fmt.Sprintf("own-%d", i))})
		}()
	}
	wg.Wait()
	done, own := 0, 0
	for i, r := range results {
		if errs[i] != nil {
			// the key-taken race: the whole statement failed and wrote nothing
			require.ErrorIs(t, errs[i], models.ErrConflict)
			continue
		}
		if r[0].Kind == idempotency.Committed {
			done++
		} else {
			require.True(t, r[0].Kind == idempotency.KeyInFlight || r[0].Kind == idempotency.KeyAnswered, "statement %d: %+v", i, r[0])
		}
		require.Equal(t, idempotency.Committed, r[1].Kind, "statement %d: its own key", i)
		own++
	}
	require.Equal(t, 1, done, "one start of the shared key committed")
	var n int64
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM validation_runs WHERE idempotency_key = 'shared'`).Scan(&n).Error)
	require.EqualValues(t, 1, n, "one run for the key")
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM validation_runs WHERE idempotency_key LIKE 'own-%'`).Scan(&n).Error)
	require.EqualValues(t, own, n)
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM validation_runs`).Scan(&n).Error)
	require.Equal(t, n, f.usage(t, f.now), "every run billed once, nothing else billed")
}

// newOrg adds an organisation with a workflow, and its period's usage
// slots (one committed start).
func (f *usageFixture) newOrg(t *testing.T, name string) (org, wf string) {
	t.Helper()
	require.NoError(t, f.db.Raw(`INSERT INTO organizations (name, slug) VALUES (?, ?) RETURNING id`, name, name).Scan(&org).Error)
	require.NoError(t, f.db.Raw(`INSERT INTO workflows (org_id, name) VALUES (?, 'wf') RETURNING id`, org).Scan(&wf).Error)
	tx := f.begin(t)
	require.NoError(t, f.runs.Start(tx, models.StartParams{ID: models.NewRunID(), CreatedAt: f.now, OrgID: org, WorkflowID: wf,
		Submission: []byte(`{}`)}))
	_, err := tx.Commit(context.Background(), nil)
	require.NoError(t, err)
	return org, wf
}

// holdRun inserts a run of p's id in holder, a transaction left open: the
// statement of p's start waits on the run's index entry until holder ends
// (and is refused if holder commits). A key row would not do: a key's
// index entry holds its expiry (migration 0012), and a writer of a key
// holds the key's lock, which a start does not wait on.
func holdRun(t *testing.T, holder *gorm.DB, p models.StartParams) {
	t.Helper()
	require.NoError(t, holder.Exec(`INSERT INTO validation_runs (id, org_id, workflow_id, status, submission)
		VALUES (?, ?, ?, 'queued', '{}')`, p.ID, p.OrgID, p.WorkflowID).Error)
}

// lockWaits is how many backends of the database wait on a lock.
func (f *usageFixture) lockWaits(t *testing.T) int64 {
	t.Helper()
	var n int64
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n).Error)
	return n
}

type startOutcome struct {
	res idempotency.Result
	err error
}

// startAsync sends a start to the batcher; its outcome comes on the channel.
func (f *usageFixture) startAsync(p models.StartParams, k *idempotency.Key) chan startOutcome {
	ch := make(chan startOutcome, 1)
	go func() {
		res, err := f.runs.StartOne(context.Background(), p, k)
		ch <- startOutcome{res, err}
	}()
	return ch
}

// busyWriters sends starts (org i's key held-i) one at a time, so that each
// takes a writer of its own and waits there on its run, which holder holds
// (holdRun).
func (f *usageFixture) busyWriters(t *testing.T, holder *gorm.DB, orgs, wfs []string) []chan startOutcome {
	t.Helper()
	var held []chan startOutcome
	ps := make([]models.StartParams, len(orgs))
	for i := range orgs {
		ps[i] = f.params(orgs[i], wfs[i], 0)
		holdRun(t, holder, ps[i])
	}
	for i := range orgs {
		held = append(held, f.startAsync(ps[i], keyWrite(orgs[i], fmt.Sprintf("held-%d", i))))
		require.Eventually(t, func() bool { return f.lockWaits(t) == int64(i+1) }, 30*time.Second, 10*time.Millisecond,
			"start %d does not wait on its held run", i)
	}
	return held
}

// requireDone waits for each start's outcome: committed.
func requireDone(t *testing.T, chs []chan startOutcome) {
	t.Helper()
	for i, ch := range chs {
		o := <-ch
		require.NoError(t, o.err, "start %d", i)
		require.Equal(t, idempotency.Committed, o.res.Kind, "start %d: %+v", i, o.res)
	}
}

// While every writer is busy (each statement waits on a key row another
// transaction holds), one organisation queues more than a batch of starts,
// then another organisation one start. Once the writers are free, that
// start goes in the first statement formed, beside the first
// organisation's oldest starts, not behind its backlog: fairness is how a
// batch is formed. Statements are told apart by the transaction that wrote
// the runs (xmin); nothing is timed. Fails with the batch cut from the
// queue's head: the start then shares the second statement with the
// backlog's tail.
func TestStartBacklogDoesNotHoldAnotherOrganisation(t *testing.T) {
	t.Parallel()
	f := newUsageFixture(t)
	require.NoError(t, f.startCommitted(t, 0, f.now)) // the period's slots, for A
	b, bwf := f.newOrg(t, "light")

	holder := f.db.Begin()
	defer holder.Rollback()
	orgs, wfs := make([]string, models.StartWritersForTest), make([]string, models.StartWritersForTest)
	for i := range orgs {
		orgs[i], wfs[i] = f.org, f.wf
	}
	held := f.busyWriters(t, holder, orgs, wfs)
	backlog := models.StartBatchMaxForTest + 10
	var starts []chan startOutcome
	for range backlog {
		starts = append(starts, f.startAsync(f.params(f.org, f.wf, 0), nil))
	}
	require.Eventually(t, func() bool { return f.runs.QueuedStartsForTest() == backlog }, 30*time.Second, 10*time.Millisecond)
	light := f.params(b, bwf, 0)
	starts = append(starts, f.startAsync(light, keyWrite(b, "light")))
	require.Eventually(t, func() bool { return f.runs.QueuedStartsForTest() == backlog+1 }, 30*time.Second, 10*time.Millisecond)

	require.NoError(t, holder.Rollback().Error)
	requireDone(t, append(held, starts...))
	var beside int64
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM validation_runs
		WHERE org_id = ? AND xmin = (SELECT xmin FROM validation_runs WHERE id = ?)`, f.org, light.ID).Scan(&beside).Error)
	require.EqualValues(t, models.StartBatchMaxForTest-1, beside,
		"the light organisation's start went in the first statement, with A's oldest starts")
}

// A statement refused as a whole (here, a run of the same id another
// transaction committed while the statement waited on it) writes nothing,
// and sends each of its starts to the transactional path, which decides it
// alone: each start then commits, the keyed one with its key's row.
func TestRefusedStatementGoesToTheTransactionalPath(t *testing.T) {
	t.Parallel()
	f := newUsageFixture(t)
	ctx := context.Background()
	require.NoError(t, f.startCommitted(t, 0, f.now)) // the period's slots
	before := f.usage(t, f.now)
	ps := []models.StartParams{f.params(f.org, f.wf, 0), f.params(f.org, f.wf, 0)}
	holder := f.db.Begin()
	defer holder.Rollback()
	holdRun(t, holder, ps[0])

	type outcome struct {
		res  []idempotency.Result
		errs []error
	}
	ch := make(chan outcome, 1)
	go func() {
		res, errs := f.runs.SendBatchForTest(ps, []*idempotency.Key{keyWrite(f.org, "raced"), nil})
		ch <- outcome{res, errs}
	}()
	require.Eventually(t, func() bool { return f.lockWaits(t) == 1 }, 30*time.Second, 10*time.Millisecond,
		"the statement does not wait on the run's row")
	require.NoError(t, holder.Commit().Error)
	o := <-ch
	for i := range ps {
		require.NoError(t, o.errs[i], "start %d", i)
		require.Equal(t, idempotency.NotDone, o.res[i].Kind, "start %d goes to the transactional path: %+v", i, o.res[i])
	}
	require.Equal(t, before, f.usage(t, f.now), "the refused statement billed nothing")
	var keys int64
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM idempotency_keys WHERE key = 'raced'`).Scan(&keys).Error)
	require.Zero(t, keys, "the refused statement wrote no key")

	k := keyWrite(f.org, "raced")
	tx, res, err := models.BeginRequest(ctx, f.db, 10*time.Second, k)
	require.NoError(t, err)
	require.NotNil(t, tx, "the key is free: %+v", res)
	ps[0].ID = models.NewRunID()
	k.ResourceID = ps[0].ID
	require.NoError(t, f.runs.Start(tx, ps[0]))
	_, err = tx.Commit(ctx, k)
	require.NoError(t, err)
	tx, _, err = models.BeginRequest(ctx, f.db, 10*time.Second, nil)
	require.NoError(t, err)
	require.NoError(t, f.runs.Start(tx, ps[1]))
	_, err = tx.Commit(ctx, nil)
	require.NoError(t, err)
	var n int64
	require.NoError(t, f.db.Raw(`SELECT count(*) FROM validation_runs WHERE id IN ?`, []string{ps[0].ID, ps[1].ID}).Scan(&n).Error)
	require.EqualValues(t, 2, n, "each start committed its run alone")
	require.Equal(t, before+2, f.usage(t, f.now))
}

// TestStartsWaitForTheWriterAtWork: while a writer's statement runs (here
// it waits on a key row another transaction holds), further starts wait in
// the queue for its next statement, not for writers of their own, until
// they make a full batch: the start that completes one gets a writer, and
// its statement carries them all. Ordering only: the stall (startStall) is
// made longer than the test, so that no writer counts as stalled.
func TestStartsWaitForTheWriterAtWork(t *testing.T) {
	t.Parallel()
	f := newUsageFixture(t)
	f.runs.SetStartStallForTest(time.Hour)
	require.NoError(t, f.startCommitted(t, 0, f.now)) // the period's slots
	var (
		mu    sync.Mutex
		sizes []int
	)
	f.runs.SetStartObserver(func(waited []time.Duration, _ time.Duration) {
		mu.Lock()
		sizes = append(sizes, len(waited))
		mu.Unlock()
	})

	holder := f.db.Begin()
	defer holder.Rollback()
	held := f.busyWriters(t, holder, []string{f.org}, []string{f.wf})
	var starts []chan startOutcome
	for range 10 {
		starts = append(starts, f.startAsync(f.params(f.org, f.wf, 0), nil))
	}
	require.Eventually(t, func() bool { return f.runs.QueuedStartsForTest() == 10 }, 10*time.Second, 10*time.Millisecond,
		"the starts did not wait in the queue for the writer at work")
	for _, ch := range starts {
		select {
		case o := <-ch:
			t.Fatalf("a start went by a writer of its own: %+v %v", o.res, o.err)
		default:
		}
	}

	for range models.StartBatchMaxForTest - 10 {
		starts = append(starts, f.startAsync(f.params(f.org, f.wf, 0), nil))
	}
	for i, ch := range starts {
		select {
		case o := <-ch:
			require.NoError(t, o.err, "start %d", i)
			require.Equal(t, idempotency.Committed, o.res.Kind, "start %d: %+v", i, o.res)
		case <-time.After(20 * time.Second): // less than the statement's timeout (30 s)
			t.Fatalf("start %d of a full batch waited behind the writer at work", i)
		}
	}
	require.EqualValues(t, 1, f.lockWaits(t), "the first writer's statement still waits on its run")
	require.NoError(t, holder.Rollback().Error)
	requireDone(t, held)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{models.StartBatchMaxForTest, 1}, sizes, "statements, in the order they ended")
}

// The start statement and the keys' statement before it run on generic
// plans, made once per connection: PostgreSQL would otherwise plan each
// afresh at every execution (it always estimates a custom plan cheaper),
// and planning the start statement costs more than a lone start's
// execution. Lone starts, keyed and not, and batches of several, on one
// connection: pg_prepared_statements (that connection's) counts no custom
// plan of either.
func TestStartBatchPlanIsGeneric(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t, testdb.Options{MaxOpenConns: 1})
	f := &usageFixture{db: db, runs: models.NewRunStore(db), now: time.Now().UTC().Truncate(time.Microsecond)}
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&f.org).Error)
	require.NoError(t, db.Raw(`INSERT INTO workflows (org_id, name) VALUES (?, 'wf') RETURNING id`, f.org).Scan(&f.wf).Error)
	require.NoError(t, f.startCommitted(t, 0, f.now)) // the period's slots
	for i := range 12 {
		ps := []models.StartParams{f.params(f.org, f.wf, 0)}
		ks := []*idempotency.Key{nil}
		if i%2 == 1 {
			ks[0] = keyWrite(f.org, fmt.Sprintf("plan-%d", i))
		}
		if i%3 == 2 {
			ps = append(ps, f.params(f.org, f.wf, 0), f.params(f.org, f.wf, 0))
			ks = append(ks, keyWrite(f.org, fmt.Sprintf("plan-%d-b", i)), nil)
		}
		res, err := f.runs.StartBatch(ps, ks)
		require.NoError(t, err)
		for j, r := range res {
			require.Equal(t, idempotency.Committed, r.Kind, "start %d.%d: %+v", i, j, r)
		}
	}
	for _, st := range []struct {
		name, like string
		runs       int64
	}{
		{"the start statement", "%AS t(id, created_at, org, wf,%", 12},
		{"the keys' statement", "%pg_try_advisory_xact_lock%", 8}, // the batches with a key
	} {
		var plans []struct{ Generic, Custom int64 }
		require.NoError(t, db.Raw(`SELECT generic_plans AS generic, custom_plans AS custom FROM pg_prepared_statements
			WHERE statement LIKE ? AND statement NOT LIKE '%pg_prepared_statements%'`, st.like).Scan(&plans).Error)
		require.Len(t, plans, 1, "%s, prepared on the one connection", st.name)
		require.Zero(t, plans[0].Custom, "custom plans of %s", st.name)
		require.EqualValues(t, st.runs, plans[0].Generic, st.name)
	}
}
