package apitest

import "testing"

// A line logged after the test ended (by a server goroutine that outlived
// it) is dropped: testing panics on t.Log then.
func TestLogAfterTheTestEndedIsDropped(t *testing.T) {
	var w *testLog
	t.Run("sub", func(t *testing.T) {
		w = newTestLog(t)
		n, err := w.Write([]byte("during the test\n"))
		if err != nil || n != len("during the test\n") {
			t.Fatalf("Write = %d, %v", n, err)
		}
	})
	w.mu.Lock()
	ended := w.ended
	w.mu.Unlock()
	if !ended {
		t.Fatal("the log still writes to the subtest after it ended")
	}
	n, err := w.Write([]byte("after the test\n"))
	if err != nil || n != len("after the test\n") {
		t.Fatalf("Write after the end = %d, %v", n, err)
	}
}
