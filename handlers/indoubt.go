package handlers

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/valruns/valruns/models"
)

// doubtfulStarts hands to the queue the runs whose start's commit was in
// doubt (the database stopped answering after it was sent: the client got
// a 503 saying the outcome is unknown) once the database answers again and
// shows they committed, instead of leaving them to the sweeper's next pass
// (RUN_REDELIVER_AFTER later, or more). It costs nothing until a commit is
// in doubt: then one statement a second asks for every run waiting here,
// until each is found, or is known not to have committed (not found once
// its statement's own deadline has passed), or its time runs out (the
// sweeper then has it, as it always would).
type doubtfulStarts struct {
	stillQueued func(ctx context.Context, ids []string) ([]string, error)
	handOff     func(*models.QueuedRun)
	// settled is when a start's statement has certainly ended: past its
	// own deadline (IDEMPOTENCY_TX_TIMEOUT and a grace).
	settled time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	pending map[string]*doubtfulRun
	polling bool
}

type doubtfulRun struct {
	run *models.QueuedRun
	// since is when the commit went in doubt.
	since time.Time
}

const (
	// doubtfulMax bounds the runs waiting here; past it, the sweeper's.
	doubtfulMax = 10000
	// doubtfulPoll is how often the database is asked.
	doubtfulPoll = time.Second
	// doubtfulGiveUp: a run still unanswered for (the database down all
	// along) is left to the sweeper.
	doubtfulGiveUp = 10 * time.Minute
)

func newDoubtfulStarts(runs *models.RunStore, handOff func(*models.QueuedRun), txTimeout time.Duration, log *slog.Logger) *doubtfulStarts {
	return &doubtfulStarts{stillQueued: runs.StillQueued, handOff: handOff, settled: txTimeout + 5*time.Second,
		log: log, pending: map[string]*doubtfulRun{}}
}

// add watches r, whose start's commit is in doubt.
func (d *doubtfulStarts) add(r *models.QueuedRun) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.pending) >= doubtfulMax {
		d.log.Warn("start in doubt left to the sweeper: too many in doubt", "run_id", r.ID)
		return
	}
	d.pending[r.ID] = &doubtfulRun{run: r, since: time.Now()}
	if !d.polling {
		d.polling = true
		go d.poll()
	}
}

// poll asks the database about the pending runs every doubtfulPoll until
// none is left.
func (d *doubtfulStarts) poll() {
	t := time.NewTicker(doubtfulPoll)
	defer t.Stop()
	for range t.C {
		d.mu.Lock()
		ids := make([]string, 0, len(d.pending))
		for id := range d.pending {
			ids = append(ids, id)
		}
		d.mu.Unlock()
		asked := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		queued, err := d.stillQueued(ctx, ids)
		cancel()
		found := make(map[string]bool, len(queued))
		for _, id := range queued {
			found[id] = true
		}
		d.mu.Lock()
		for id, p := range d.pending {
			switch {
			case err == nil && found[id]:
				d.log.Info("start in doubt had committed: run handed off", "run_id", id)
				d.handOff(p.run)
			case err == nil && asked.Sub(p.since) > d.settled:
				// Not queued once its statement has surely ended: it did
				// not commit, or was taken already.
			case asked.Sub(p.since) > doubtfulGiveUp:
				d.log.Warn("start in doubt left to the sweeper: the database did not answer", "run_id", id, "error", err)
			default:
				continue
			}
			delete(d.pending, id)
		}
		if len(d.pending) == 0 {
			d.polling = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
	}
}
