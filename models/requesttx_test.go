package models_test

import (
	"bytes"
	"context"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// Requests waiting for a connection get one in the order they came.
// database/sql alone hands a freed connection to a random waiter, which made
// the p99 of a start under overload six times its p50.
// Not parallel: waitingForConn counts every goroutine of the process.
func TestRequestsGetConnectionsInArrivalOrder(t *testing.T) {
	db, _ := testdb.New(t, testdb.Options{MaxOpenConns: 1})
	holder, _, err := models.BeginRequest(context.Background(), db, 10*time.Second, nil)
	require.NoError(t, err)

	const waiters = 12
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range waiters {
		wg.Go(func() {
			tx, _, err := models.BeginRequest(context.Background(), db, 10*time.Second, nil)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			tx.Rollback()
		})
		// The next request comes only once this one is waiting.
		require.Eventually(t, func() bool { return waitingForConn() == i+1 }, 10*time.Second, time.Millisecond,
			"request %d never waited for a connection", i)
	}
	holder.Rollback()
	wg.Wait()

	want := make([]int, waiters)
	for i := range want {
		want[i] = i
	}
	require.Equal(t, want, order)
}

// waitingForConn counts the goroutines blocked in BeginRequest waiting for a
// connection, at the gate or in database/sql's pool.
func waitingForConn() int {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for _, g := range strings.Split(b.String(), "\n\n") {
		blocked := strings.Contains(g, "[select") || strings.Contains(g, "[chan send") || strings.Contains(g, "[chan receive")
		if blocked && strings.Contains(g, "models.BeginRequest(") {
			n++
		}
	}
	return n
}

// One organisation's flood delays another organisation's request by about
// one turn, not by the whole flood queued before it: the turns go to the
// organisations waiting in rotation. An organisation alone still holds
// every connection at once.
// Not parallel: waitingForConn counts every goroutine of the process.
func TestAnOrganisationsRequestWaitsBehindOneTurnOfAnothersFlood(t *testing.T) {
	db, _ := testdb.New(t, testdb.Options{MaxOpenConns: 2})
	a := models.WithTenant(context.Background(), "org-a")
	b := models.WithTenant(context.Background(), "org-b")
	// A alone takes both connections, at once.
	var holders []*models.RequestTx
	for range 2 {
		tx, _, err := models.BeginRequest(a, db, 10*time.Second, nil)
		require.NoError(t, err)
		holders = append(holders, tx)
	}

	const flood = 20
	var (
		mu      sync.Mutex
		order   []string
		wg      sync.WaitGroup
		release = make(chan struct{})
	)
	// Each request keeps its connection until release: with two
	// connections, the first two recorded are the first two granted,
	// however late a goroutine records itself.
	begin := func(ctx context.Context, who string) {
		tx, _, err := models.BeginRequest(ctx, db, 10*time.Second, nil)
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		order = append(order, who)
		mu.Unlock()
		<-release
		tx.Rollback()
	}
	granted := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(order)
	}
	for range flood {
		wg.Go(func() { begin(a, "A") })
	}
	require.Eventually(t, func() bool { return waitingForConn() == flood }, 10*time.Second, time.Millisecond,
		"A's flood never waited for connections")
	wg.Go(func() { begin(b, "B") })
	require.Eventually(t, func() bool { return waitingForConn() == flood+1 }, 10*time.Second, time.Millisecond,
		"B's request never waited for a connection")
	for _, h := range holders {
		h.Rollback()
	}
	require.Eventually(t, func() bool { return len(granted()) == 2 }, 10*time.Second, time.Millisecond,
		"the two connections freed were granted")
	first := granted()
	close(release)
	wg.Wait()

	require.Len(t, order, flood+1)
	// The first freed turn goes to A (first in the rotation), the second to
	// B: not to the next of A's 20 requests queued before B's.
	require.Contains(t, first, "B", "the two connections freed went to %v; B's request waited behind A's flood", first)
}
