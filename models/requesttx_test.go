package models_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
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
// organisations waiting in rotation, each organisation's requests in the
// order they came. An organisation alone still holds every connection.
//
// On one connection (A holds the other), A's 8 requests queue, then B's 4, then C's 4, each
// only once the one before waits; then the connection goes from one to the
// next, each request releasing it only once it is recorded, so the order
// recorded is the order granted. In rotation that is A1 B1 C1 A2 B2 C2 ...
// A5 A6 A7 A8, exactly. database/sql alone hands a freed connection to a
// random waiter: with the turns removed, B's first request lands anywhere
// among the 16, and this order comes out about once in 10^9 tries.
// Not parallel: waitingForConn counts every goroutine of the process.
func TestAnOrganisationsRequestWaitsBehindOneTurnOfAnothersFlood(t *testing.T) {
	db, _ := testdb.New(t, testdb.Options{MaxOpenConns: 2})
	a := models.WithTenant(context.Background(), "org-a")
	// A alone takes both connections, at once.
	var holders []*models.RequestTx
	for range 2 {
		tx, _, err := models.BeginRequest(a, db, time.Minute, nil)
		require.NoError(t, err)
		holders = append(holders, tx)
	}
	defer holders[1].Rollback() // held to the end: one connection goes round

	tenants := []struct {
		name string
		n    int
	}{{"A", 8}, {"B", 4}, {"C", 4}}
	granted := make(chan string)
	var wg sync.WaitGroup
	waiting := 0
	for _, o := range tenants {
		ctx := models.WithTenant(context.Background(), "org-"+o.name)
		for i := range o.n {
			who := fmt.Sprintf("%s%d", o.name, i+1)
			wg.Go(func() {
				tx, _, err := models.BeginRequest(ctx, db, time.Minute, nil)
				if err != nil {
					t.Error(who, err)
					granted <- who + " failed"
					return
				}
				granted <- who // the test takes it before the next is granted: one connection
				tx.Rollback()
			})
			waiting++
			// The next request comes only once this one waits.
			require.Eventually(t, func() bool { return waitingForConn() == waiting }, 10*time.Second, time.Millisecond,
				"%s never waited for a connection", who)
		}
	}
	holders[0].Rollback()
	var order []string
	for range waiting {
		order = append(order, <-granted)
	}
	wg.Wait()
	require.Equal(t, []string{"A1", "B1", "C1", "A2", "B2", "C2", "A3", "B3", "C3", "A4", "B4", "C4", "A5", "A6", "A7", "A8"},
		order, "the turns in rotation, each organisation's requests in the order they came")
}
