package models

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A request that leaves while it waits holds nothing and loses its place;
// a turn given as it leaves goes on to the next request waiting.
func TestTurnsOfRequestsThatLeave(t *testing.T) {
	tr := newTurns(1)
	require.True(t, tr.take(context.Background(), "a"))

	gone, leave := context.WithCancel(context.Background())
	left := make(chan bool)
	go func() { left <- tr.take(gone, "b") }()
	waiting := make(chan bool)
	require.Eventually(t, func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return len(tr.queues["b"]) == 1
	}, 10*time.Second, time.Millisecond)
	go func() { waiting <- tr.take(context.Background(), "c") }()
	require.Eventually(t, func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return len(tr.ring) == 2
	}, 10*time.Second, time.Millisecond)

	leave()
	require.False(t, <-left, "a request that left got a turn")
	tr.give() // a's turn goes to c, not to b, which left
	require.True(t, <-waiting)
	tr.give()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.Equal(t, 1, tr.free, "a turn was lost or made up")
	require.Empty(t, tr.ring)
	require.Empty(t, tr.queues)
}
