package main

import "testing"

// TestScaleTopologiesHavePorts: every topology the scale table runs fits
// in the ports the harness checks free at its start (maxAPIs, maxWorkers),
// and the ports of all its processes differ.
func TestScaleTopologiesHavePorts(t *testing.T) {
	t.Parallel()
	e := &env{port: 18080}
	for _, top := range append(scaleFull, scaleQuick...) {
		if top.APIs > maxAPIs || top.Workers > maxWorkers {
			t.Errorf("%d APIs and %d workers: the harness checks ports for at most %d and %d", top.APIs, top.Workers, maxAPIs, maxWorkers)
		}
	}
	seen := map[int]bool{e.port + 1: true} // the peer's
	for i := range maxAPIs {
		seen[e.apiPort(i)] = true
	}
	for j := range maxWorkers {
		seen[e.workerPort(j)] = true
	}
	if len(seen) != 1+maxAPIs+maxWorkers {
		t.Errorf("ports overlap: %v", seen)
	}
}
