package main

// Start-to-running latency at light load: one client starts a run, and
// polls it until a worker has taken it (status no longer queued), with
// `valruns serve --worker`.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/google/uuid"
)

type latencyResult struct {
	Samples int
	// Observed: from the 201 to the first poll that saw the run past
	// queued (polls every PollEvery, so this includes up to that much).
	Observed []time.Duration
	// Started: from the 201 to the run's started_at (the worker's claim,
	// by the same machine's clock); 0 when the claim came before the 201
	// reached the client.
	Started   []time.Duration
	PollEvery time.Duration
	Failed    string
}

func (e *env) measureStartToRunning(ctx context.Context, samples int) (res latencyResult) {
	res.PollEvery = 2 * time.Millisecond
	fail := func(err error) latencyResult {
		res.Failed = err.Error()
		return res
	}
	db, err := e.fresh(ctx)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = e.dropDB(ctx, db) }()
	if err := e.flushRedis(ctx); err != nil {
		return fail(err)
	}
	srv, base, err := e.startServer(ctx, db, true)
	if err != nil {
		return fail(err)
	}
	defer srv.Stop(20 * time.Second)
	hc := newHTTPClient(2)
	org := e.orgs[0]
	one := func() (observed, started time.Duration, err error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+org.startPath(), bytesReader([]byte(startBody)))
		req.Header = headerFor(org.Token, uuid.NewString())
		resp, err := hc.Do(req)
		if err != nil {
			return 0, 0, err
		}
		b := readAll(resp)
		t201 := time.Now()
		if resp.StatusCode != http.StatusCreated {
			return 0, 0, fmt.Errorf("start: %d %s", resp.StatusCode, short(string(b), 200))
		}
		var run struct {
			ID        string     `json:"id"`
			Status    string     `json:"status"`
			StartedAt *time.Time `json:"started_at"`
		}
		if err := json.Unmarshal(b, &run); err != nil {
			return 0, 0, err
		}
		deadline := t201.Add(30 * time.Second)
		for run.Status == "queued" {
			if time.Now().After(deadline) {
				return 0, 0, fmt.Errorf("run %s still queued after 30s", run.ID)
			}
			time.Sleep(res.PollEvery)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/runs/"+run.ID+"/", nil)
			req.Header = headerFor(org.Token, "")
			resp, err := hc.Do(req)
			if err != nil {
				return 0, 0, err
			}
			b := readAll(resp)
			if resp.StatusCode != http.StatusOK {
				return 0, 0, fmt.Errorf("read run: %d %s", resp.StatusCode, short(string(b), 200))
			}
			if err := json.Unmarshal(b, &run); err != nil {
				return 0, 0, err
			}
		}
		observed = time.Since(t201)
		if run.StartedAt != nil {
			started = max(0, run.StartedAt.Sub(t201))
		} else {
			started = observed
		}
		return observed, started, nil
	}
	for range 3 { // warm-up: connections, caches, the worker's first poll
		if _, _, err := one(); err != nil {
			return fail(err)
		}
	}
	for range samples {
		o, s, err := one()
		if err != nil {
			return fail(err)
		}
		res.Observed = append(res.Observed, o)
		res.Started = append(res.Started, s)
		time.Sleep(20 * time.Millisecond) // light load: one start at a time, with pauses
	}
	slices.Sort(res.Observed)
	slices.Sort(res.Started)
	res.Samples = samples
	return res
}
