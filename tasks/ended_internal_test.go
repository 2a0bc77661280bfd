package tasks

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A notice names every run ended since the last message, or none (a look)
// past endedMaxIDs; with nothing ended there is no message.
func TestEndedNoticeNamesTheRuns(t *testing.T) {
	n := newEndedNotice(nil)
	_, ok := n.take()
	require.False(t, ok, "nothing ended: no message")
	n.ended("a")
	n.ended("b")
	msg, ok := n.take()
	require.True(t, ok)
	require.Equal(t, "a,b", msg)
	_, ok = n.take()
	require.False(t, ok, "each run is named once")
	for i := range endedMaxIDs + 1 {
		n.ended(fmt.Sprint(i))
	}
	msg, ok = n.take()
	require.True(t, ok)
	require.Empty(t, msg, "too many to name: a look")
}

// The watcher never blocks: a message not read yet is merged with the
// next, and a look (nil) or too many runs merge into a look.
func TestPassMergesWhatWasNotRead(t *testing.T) {
	ch := make(chan []string, 1)
	pass(ch, []string{"a"})
	pass(ch, []string{"b"})
	require.Equal(t, []string{"a", "b"}, <-ch)
	pass(ch, []string{"a"})
	pass(ch, nil)
	require.Nil(t, <-ch, "a look absorbs the runs named")
	pass(ch, make([]string, endedMaxIDs))
	pass(ch, []string{"x"})
	require.Nil(t, <-ch, "more than a message names: a look")
	require.Empty(t, ch)
}
