package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"gorm.io/gorm"
)

// RunStore reads and writes validation runs.
type RunStore struct {
	db      *gorm.DB
	batcher *startBatcher
	// ended, when set, is told about each run a statement ended
	// (SetEndObserver).
	ended func(status string, startToFinal time.Duration)
}

// NewRunStore returns a RunStore on db.
func NewRunStore(db *gorm.DB) *RunStore {
	return &RunStore{db: db, batcher: &startBatcher{db: db, timeout: 30 * time.Second, stallAfter: startStall}}
}

// SetStartTimeout bounds each statement of the start's fast path (the
// request transaction's IDEMPOTENCY_TX_TIMEOUT); 0 keeps 30s.
func (s *RunStore) SetStartTimeout(d time.Duration) {
	if d > 0 {
		s.batcher.timeout = d
	}
}

// SetStartObserver makes the store tell f about each statement of starts
// it sent (the one-step path, StartOne): how many starts it carried, how
// long each of them waited for a writer (waited, one per start), and how
// long the statement took, from taking a connection to its answers and
// commit. Set it before the first start.
func (s *RunStore) SetStartObserver(f func(waited []time.Duration, statement time.Duration)) {
	s.batcher.observe = f
}

// StartParams is what starting a run needs. The run's id and creation time
// are made by the caller (NewRunID, NewRunTime), so that its answer can be
// rendered before it is written.
type StartParams struct {
	ID                string
	CreatedAt         time.Time
	OrgID, WorkflowID string
	// Submission is JSON text; Metadata a JSON object, nil is {}.
	Submission, Metadata []byte
	// Quota is the organisation's effective monthly quota; 0 means unlimited.
	// The usage period is CreatedAt's month (UTC).
	Quota int64
	// Who started it, for the audit trail (the audit_records view).
	TokenID, RequestID, IdempotencyKey string
	// RunShare is the organisation's own run share, handed to the queue
	// with the run (nil: ORG_RUN_SHARE; 0: unlimited). Not written.
	RunShare *int
}

// The asynq task that executes a run: its type, and the prefix of its
// TaskID (the prefix plus the run id: a run is handed to the queue once).
const (
	RunJobName      = "validation_run:execute"
	RunTaskIDPrefix = "validation_run:"
)

// The statements of a start in a transaction (sql/start_tx_fast.sql: the
// run and its slot in one statement; sql/start_slow.sql: the run, once the
// slow path has claimed its slot). Both list the run as unfinished, as
// sql/start_batch.sql does, where the sweeper looks for it (migration 0010).
var (
	startTxFastSQL = statement("start_tx_fast")
	startSlowSQL   = statement("start_slow")
)

// The statements that read runs: a page of one final status
// (sql/list_final.sql), and which of a set of runs are final
// (sql/final_runs.sql).
var (
	listFinalSQL = statement("list_final")
	finalRunsSQL = statement("final_runs")
)

// Start creates the queued run p on tx, billed to its usage of the period:
// a start in a transaction, for the starts the one-step path (StartOne)
// leaves to one (NotDone: StartOne says which). Nearly always one statement
// that takes no lock another start of the organisation needs (a usage slot
// no other transaction holds, FOR UPDATE SKIP LOCKED, see migration 0002).
// Only when no slot could be claimed that way (an unknown workflow, a new
// month, a changed quota, the quota's edge, or more starts of one
// organisation in flight than slots) does it check the workflow, and claim
// a slot, waiting for other starts and rebalancing the slots if need be
// (refused past the quota). If it refuses, nothing is
// written, so the caller can answer 404 or 429 on the same transaction.
//
// Returns ErrNotFound when the workflow is not the organisation's,
// ErrOrgGone when the organisation no longer exists, and ErrQuotaExceeded
// past the quota.
//
// The slow path waits for slots other starts hold, and a statement claiming
// a slot may wait for one that a waiting claim holds (PostgreSQL follows a
// slot's newer version even under SKIP LOCKED): PostgreSQL may then break a
// deadlock by failing one of them. Everything here runs under a savepoint,
// so such a failure is rolled back, nothing held, and tried again.
func (s *RunStore) Start(tx *RequestTx, p StartParams) error {
	for try := 1; ; try++ {
		err := s.startOnce(tx, p)
		if err == nil || !isDeadlock(err) || try == 5 {
			return err
		}
		if rerr := tx.pgx(func(c *pgx.Conn) error {
			_, err := c.Exec(tx.Context(), `ROLLBACK TO SAVEPOINT start_run`)
			return err
		}); rerr != nil {
			return err
		}
	}
}

// isDeadlock reports whether err is PostgreSQL's deadlock_detected.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

func (s *RunStore) startOnce(tx *RequestTx, p StartParams) error {
	meta := p.Metadata
	if len(meta) == 0 {
		meta = []byte("{}")
	}
	ctx := tx.Context()
	period := UsagePeriod(p.CreatedAt)
	runArgs := []any{p.ID, string(p.Submission), string(meta), p.CreatedAt,
		nullable(p.TokenID), nullable(truncate(p.RequestID, 200)), nullable(p.IdempotencyKey)}
	found := false
	err := tx.pgx(func(c *pgx.Conn) error {
		// A slot this statement locked but passed over (another start
		// filled it meanwhile) stays locked until its transaction ends, and
		// the slow path may then wait for the slots' rebalancing lock, whose
		// holder may wait for that slot: a deadlock. Rolled back to the
		// savepoint, the statement holds nothing.
		var b pgx.Batch
		b.Queue(`SAVEPOINT start_run`)
		args := append([]any{p.WorkflowID, p.OrgID, period, p.Quota, slotOffset(), UsageSlots}, runArgs...)
		b.Queue(startTxFastSQL, args...).QueryRow(func(row pgx.Row) error {
			var id string
			err := row.Scan(&id)
			found = err == nil
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		if err := c.SendBatch(ctx, &b).Close(); err != nil || found {
			return err
		}
		_, err := c.Exec(ctx, `ROLLBACK TO SAVEPOINT start_run`)
		return err
	})
	if err != nil || found {
		return translateStart(err)
	}

	db := tx.DB()
	var n int64
	if err := db.Raw(`SELECT count(*) FROM workflows WHERE id = ? AND org_id = ?`, p.WorkflowID, p.OrgID).Scan(&n).Error; err != nil {
		return fmt.Errorf("start run: %w", translate(err))
	}
	if n == 0 {
		// The organisation's own workflows go with it: a token still
		// trusted from a cache is told that, not that a workflow is missing.
		if err := db.Raw(`SELECT count(*) FROM organizations WHERE id = ?`, p.OrgID).Scan(&n).Error; err != nil {
			return fmt.Errorf("start run: %w", translate(err))
		}
		if n == 0 {
			return fmt.Errorf("start run: organisation %s: %w", p.OrgID, ErrOrgGone)
		}
		return fmt.Errorf("start run: workflow %s: %w", p.WorkflowID, ErrNotFound)
	}
	if err := claimSlot(db, p.OrgID, period, p.Quota); err != nil {
		return fmt.Errorf("start run: %w", err)
	}
	return translateStart(tx.pgx(func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, startSlowSQL, append([]any{p.OrgID, p.WorkflowID}, runArgs...)...)
		return err
	}))
}

func translateStart(err error) error {
	if err != nil {
		return fmt.Errorf("start run: %w", translate(err))
	}
	return nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// uuidArg is id as a uuid parameter: pgx encodes an array of pgtype.UUID
// far faster than an array of strings, which it parses by way of its text
// codec. An id that is not a UUID (never: run ids are made here, the others
// were read from the database or checked by the handler) is null: then the
// start goes by the slow path (no workflow, no organisation) or fails on
// the run's NOT NULL id, as a string failed to encode.
func uuidArg(id string) pgtype.UUID {
	u, err := uuid.Parse(id)
	return pgtype.UUID{Bytes: u, Valid: err == nil}
}

// Get reads one run of the organisation with its findings.
func (s *RunStore) Get(ctx context.Context, orgID, id string) (*ValidationRun, error) {
	var r ValidationRun
	err := s.db.WithContext(ctx).Where("id = ? AND org_id = ?", id, orgID).Take(&r).Error
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", id, translate(err))
	}
	return &r, nil
}

// RunFilter narrows a list of runs; its zero value lists them all.
type RunFilter struct {
	// WorkflowID: only that workflow's runs ("" for all).
	WorkflowID string
	// Status: only runs in that status (RunQueued... RunError; "" for any).
	Status string
	// CreatedAfter and CreatedBefore: only runs created strictly after,
	// and strictly before, these times (nil: no bound; the zero time is a
	// bound like any other).
	CreatedAfter, CreatedBefore *time.Time
}

// FinalScanBudget is how many runs a page of a list filtered on a final
// status (passed, failed, error) reads at most. No index holds the status
// (a run's end must stay a HOT update, migration 0010), so such a page
// walks the organisation's runs newest first and keeps those in the
// status: without a bound, a status an organisation never had would read
// all its runs. A page that reaches the bound ends there, with fewer runs
// than asked for (even none) and a cursor to go on from.
const FinalScanBudget = 2000

// runListColumns are the columns a list of runs reads: none whose size a
// client chose (submission, metadata, findings), so that a page costs the
// same memory whatever the runs hold. error is at most 2000 characters.
var runListColumns = []string{"id", "workflow_id", "status", "error", "attempts", "created_at", "started_at", "finished_at"}

// List returns one page of the organisation's runs that f lets through,
// newest first, and where the next page starts (nil on the last one). The
// runs are read without their submission, metadata and findings (nil):
// Get reads them, one run at a time.
//
// No index of its own: the indexes that order the organisation's or the
// workflow's runs by creation serve the time bounds and the cursor. The
// runs queued or running are found through unfinished_runs: a page costs
// about the runs not yet final, whoever's (PostgreSQL may walk the
// organisation's runs instead when it estimates that cheaper). A final
// status reads at most FinalScanBudget runs per page.
func (s *RunStore) List(ctx context.Context, orgID string, f RunFilter, p Page) ([]ValidationRun, *Position, error) {
	q := s.db.WithContext(ctx).Select(runListColumns).Where("org_id = ?", orgID)
	if f.WorkflowID != "" {
		q = q.Where("workflow_id = ?", f.WorkflowID)
	}
	// created_at holds whole microseconds, so a bound between two is
	// sent as the one that selects the same runs: down for "after", up for
	// "before" (never left to the encoding, which may round either way).
	if f.CreatedAfter != nil {
		q = q.Where("created_at > ?", f.CreatedAfter.Truncate(time.Microsecond))
	}
	if f.CreatedBefore != nil {
		before := f.CreatedBefore.Truncate(time.Microsecond)
		if before.Before(*f.CreatedBefore) {
			before = before.Add(time.Microsecond)
		}
		q = q.Where("created_at < ?", before)
	}
	var (
		rs   []ValidationRun
		next *Position
		err  error
	)
	switch f.Status {
	case "":
		rs, next, err = listPage(q, p, runKey)
	case RunQueued, RunRunning:
		rs, next, err = listPage(q.Where("status = ? AND id IN (SELECT id FROM unfinished_runs)", f.Status), p, runKey)
	default:
		rs, next, err = s.listFinal(q, f.Status, p)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list runs: %w", err)
	}
	return rs, next, nil
}

func runKey(r *ValidationRun) Position { return Position{r.CreatedAt, r.ID} }

// scannedRun is a run a page of listFinal read: in the status asked for
// (Hit), or the last one its scan may read, where the next page starts
// (Edge).
type scannedRun struct {
	ValidationRun
	Hit, Edge bool
}

// listFinal is a page of the runs of q in the final status, reading at most
// FinalScanBudget runs (see List), in one statement. The inner query walks
// the runs by the list's index, newest first, from the page's start, up to the
// budget; the outer one keeps the runs in the status and the budget's last
// run. Each step streams: the walk stops as soon as the page is full, so a
// common status reads about limit/share runs, a rare one the budget.
func (s *RunStore) listFinal(q *gorm.DB, status string, p Page) ([]ValidationRun, *Position, error) {
	scan := p.after(q).Model(&ValidationRun{}).Order("created_at DESC, id DESC").Limit(FinalScanBudget)
	var rows []scannedRun
	err := s.db.WithContext(q.Statement.Context).Raw(listFinalSQL, status, FinalScanBudget, scan, p.limit()+1).Scan(&rows).Error
	if err != nil {
		return nil, nil, translate(err)
	}
	var (
		hits []ValidationRun
		edge *ValidationRun
	)
	for i := range rows {
		if rows[i].Hit {
			hits = append(hits, rows[i].ValidationRun)
		}
		if rows[i].Edge {
			edge = &rows[i].ValidationRun
		}
	}
	switch {
	case len(hits) > p.limit():
		hits = hits[:p.limit()]
		next := runKey(&hits[len(hits)-1])
		return hits, &next, nil
	case edge != nil:
		next := runKey(edge)
		return hits, &next, nil
	}
	return hits, nil, nil
}

// Finished returns those of ids whose runs are final (passed, failed or
// error), in one statement whatever the number of ids: the long-poll's
// poller asks it for every run its waiters wait on at once. The ids must be
// UUIDs; the runs' organisations are not checked (the waiters read their
// own run again, scoped to their organisation).
func (s *RunStore) Finished(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var final []string
	err := s.db.WithContext(ctx).Raw(finalRunsSQL,
		strings.Join(ids, ","), RunPassed, RunFailed, RunError).Scan(&final).Error
	if err != nil {
		return nil, fmt.Errorf("read final runs: %w", translate(err))
	}
	return final, nil
}
