package models_test

import (
	"bytes"
	"context"
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
