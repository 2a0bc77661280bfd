package handlers

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a long-poll's wait, the label of valruns_run_waits_total.
const (
	waitFinal    = "final"    // the run became final
	waitTimeout  = "timeout"  // the wait applied ran out first
	waitGone     = "gone"     // the client hung up
	waitShutdown = "shutdown" // the process began to stop
)

// runPollEvery is how often the poller asks PostgreSQL which waited runs
// are final when nothing says they ended (Deps.RunsEnded): a run that ends
// is answered within about this long, should both its message and the
// look a join asks for be lost (the statement failed, say).
const runPollEvery = 100 * time.Millisecond

// runPollGap is the least time between two of the poller's statements: a
// stream of ending runs costs at most one statement per gap per process.
const runPollGap = 2 * time.Millisecond

// runWaits is the long-poll's hub (GET /api/runs/{id}/ with
// `Prefer: wait=N`): requests waiting for their run to become final, and
// one poller. The runs a worker says ended (ended: the workers' Redis
// channel, each run named after its final commit) have their waiters woken
// at once. And while any request waits, the poller asks PostgreSQL in one
// statement which of all the runs waited on are final, then wakes their
// waiters: as soon as a request joins (its run may have ended between the
// handler's read and the join, its message heard before it waited), as
// soon as a worker says runs ended without naming them, at most every
// runPollGap, and every runPollEvery in case a message was lost. The cost
// to the database is one statement per tick, join or unnamed message per
// process however many wait, and nothing when none does; no
// waiter holds a database connection, nor a request slot of the overload
// guard (the handler gives its slot back before it waits). No NOTIFY: the
// run's final transaction stays as it is.
type runWaits struct {
	// finished returns those of ids whose runs are final (RunStore.Finished
	// under the bound of a first answer).
	finished func(ctx context.Context, ids []string) ([]string, error)
	every    time.Duration
	max      int             // waiters at once (RUN_MAX_WAITERS)
	stop     <-chan struct{} // closed when the process stops: every waiter answers now
	// ended names runs that ended, or is nil when runs ended unnamed (nil
	// channel: the tick only).
	ended <-chan []string
	// joined is marked by each join: the poller looks at once, for the
	// runs joined since its last statement.
	joined chan struct{}
	log    *slog.Logger

	mu      sync.Mutex
	byRun   map[string]map[*runWaiter]struct{} // run id -> its waiters
	n       int                                // waiters in byRun
	byOrg   map[string]int                     // organisation -> its waiters
	polling bool                               // the poller runs
	failing int                                // the poller's failed statements in a row

	waits *prometheus.CounterVec
}

type runWaiter struct {
	org   string
	run   string
	woken chan struct{} // closed by the poller once the run is final
}

func newRunWaits(finished func(context.Context, []string) ([]string, error), max int, stop <-chan struct{},
	log *slog.Logger, reg prometheus.Registerer) *runWaits {
	h := &runWaits{
		finished: finished, every: runPollEvery, max: max, stop: stop, log: log, joined: make(chan struct{}, 1),
		byRun: map[string]map[*runWaiter]struct{}{}, byOrg: map[string]int{},
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_run_waits_total",
			Help: "Long-polls of a run (GET /api/runs/{id}/ with Prefer: wait) that waited, by how their wait ended: final (the run became final), timeout, gone (the client hung up), shutdown.",
		}, []string{"outcome"}),
	}
	for _, o := range []string{waitFinal, waitTimeout, waitGone, waitShutdown} {
		h.waits.WithLabelValues(o) // every outcome shows, at 0
	}
	reg.MustRegister(h.waits, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "valruns_run_waiters",
		Help: "Long-polls of this process waiting for their run to become final (bounded by RUN_MAX_WAITERS).",
	}, func() float64 { return float64(h.waiting()) }))
	return h
}

// waiting is how many requests wait now.
func (h *runWaits) waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// join takes a place for organisation org among the waiters of run,
// starting the poller if none runs; nil when RUN_MAX_WAITERS wait already,
// when org holds its share of them (a quarter, at least one: one
// organisation's long-polls cannot take every place), or the process is
// stopping: the request then answers at once.
func (h *runWaits) join(org, run string) *runWaiter {
	select {
	case <-h.stop:
		return nil
	default:
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n >= h.max || h.byOrg[org] >= max(1, h.max/4) {
		return nil
	}
	w := &runWaiter{org: org, run: run, woken: make(chan struct{})}
	h.byOrg[org]++
	if h.byRun[run] == nil {
		h.byRun[run] = map[*runWaiter]struct{}{}
	}
	h.byRun[run][w] = struct{}{}
	h.n++
	select { // a mark there already covers this join too
	case h.joined <- struct{}{}:
	default:
	}
	if !h.polling {
		h.polling = true
		go h.poll()
	}
	return w
}

// wait waits until w's run is final, d has passed, ctx has ended (the
// client hung up) or the process stops, leaves, and says which came first.
func (h *runWaits) wait(ctx context.Context, w *runWaiter, d time.Duration) string {
	t := time.NewTimer(d)
	defer t.Stop()
	var outcome string
	select {
	case <-w.woken:
		outcome = waitFinal
	case <-t.C:
		outcome = waitTimeout
	case <-ctx.Done():
		outcome = waitGone
	case <-h.stop:
		outcome = waitShutdown
	}
	h.leave(w)
	h.waits.WithLabelValues(outcome).Inc()
	return outcome
}

// leave removes w, unless the poller woke it (and removed it) already.
func (h *runWaits) leave(w *runWaiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.byRun[w.run]
	if _, ok := ws[w]; !ok {
		return
	}
	delete(ws, w)
	h.gone(w)
	if len(ws) == 0 {
		delete(h.byRun, w.run)
	}
}

// poll asks, every h.every and whenever runs end unnamed or a request joins
// (h.ended, h.joined: at most every runPollGap), which of the runs waited
// on are final, and wakes their waiters; the runs named ended wake theirs
// at once. It returns once no request waits (or the process stops), so an
// idle process sends nothing.
func (h *runWaits) poll() {
	t := time.NewTicker(h.every)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-h.stop:
			h.mu.Lock()
			h.polling = false
			h.mu.Unlock()
			return
		case <-t.C:
		case ids := <-h.ended:
			if ids != nil {
				h.wakeRuns(ids)
				continue
			}
			time.Sleep(time.Until(last.Add(runPollGap)))
		case <-h.joined:
			time.Sleep(time.Until(last.Add(runPollGap)))
		}
		last = time.Now()
		ids := h.runs()
		if ids == nil {
			return
		}
		final, err := h.finished(context.Background(), ids)
		if err != nil {
			h.failed(err, len(ids))
			continue // the waiters wait on, until their time runs out
		}
		h.wake(final)
	}
}

// runs returns the runs waited on; nil when none is, and then the poller
// stops (under the lock, so that the next join starts another).
func (h *runWaits) runs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.byRun) == 0 {
		h.polling = false
		return nil
	}
	ids := make([]string, 0, len(h.byRun))
	for id := range h.byRun {
		ids = append(ids, id)
	}
	return ids
}

// gone counts w out (h.mu held).
func (h *runWaits) gone(w *runWaiter) {
	h.n--
	if h.byOrg[w.org]--; h.byOrg[w.org] <= 0 {
		delete(h.byOrg, w.org)
	}
}

// wake answers the waiters of the runs found final.
func (h *runWaits) wake(final []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failing > 0 {
		h.log.Info("run long-poll: the poller reads the runs' states again", "failed_ticks", h.failing)
		h.failing = 0
	}
	h.wakeLocked(final)
}

// wakeRuns answers the waiters of the runs a worker said ended.
func (h *runWaits) wakeRuns(ids []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wakeLocked(ids)
}

// wakeLocked answers the waiters of runs (h.mu held).
func (h *runWaits) wakeLocked(final []string) {
	for _, id := range final {
		for w := range h.byRun[id] {
			close(w.woken)
			h.gone(w)
		}
		delete(h.byRun, id)
	}
}

// failed logs the poller's failure when a streak begins, and every 100th
// tick of it (10 s): an outage does not flood the log.
func (h *runWaits) failed(err error, runs int) {
	h.mu.Lock()
	h.failing++
	n := h.failing
	h.mu.Unlock()
	if n%100 == 1 {
		h.log.Warn("run long-poll: cannot read which runs are final; the waiters wait on until their time runs out",
			"err", err, "runs", runs, "failed_ticks", n)
	}
}
