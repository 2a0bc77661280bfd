package models

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/valruns/valruns/idempotency"
)

// A start is written by one statement of starts (start_batch.sql, after
// start_locks.sql when a start has a key), sent in autocommit by the start
// batcher: it takes the key's lock, checks the key and the workflow, bills
// a usage slot, and writes the key row with its answer and the run, all or
// nothing. Concurrent starts share that statement, as a group commit
// shares a flush; a lone start is a batch of one. The run's id and time
// are made here, before the SQL, so that the answer is rendered first.
// What the statement cannot decide goes to the transactional path
// (StartOne says which starts those are).

// NewRunID makes a run's id: a UUIDv7, time-ordered.
func NewRunID() string { return uuid.Must(uuid.NewV7()).String() }

// NewRunTime is a run's creation time as stored (microseconds, UTC).
func NewRunTime() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

const (
	// startBatchMax is the most starts one statement carries.
	startBatchMax = 64
	// startWriters is the most statements of starts under way at once.
	// One writer is normally at work: PostgreSQL's work is mostly per
	// statement (its executor, its commit), so fewer, fuller statements
	// start more runs. Another writer joins only when a full batch waits
	// behind the writers at work, or when each of them has stalled.
	startWriters = 4
	// startStall is how long a statement of starts runs before its writer
	// counts as stalled (a lock, a slow disk): a start that then finds no
	// other writer at work gets one of its own, so that one stuck statement
	// does not hold every start. Far longer than a statement takes under
	// load, so that it never splits batches.
	startStall = 50 * time.Millisecond
)

type startReq struct {
	// queued is when the start was submitted.
	queued time.Time
	p      StartParams
	k      *idempotency.Key
	done   chan struct{}
	res    idempotency.Result
	err    error
	// span is the request's span, when it is recorded (tracing on):
	// the statement's spans join its trace (tracedBatch).
	span trace.Span
}

// startBatcher sends the starts waiting in its queue, up to startBatchMax
// per statement. Writers exist only while starts wait: normally one, whose
// next statement carries the starts that arrived while its last one ran.
// A start that finds no writer at work (none, or each stalled) starts one,
// and so does a start that completes a full batch, up to startWriters. A
// writer ends when the queue is empty, or holds less than a full batch
// while another writer is at work.
//
// Fairness between organisations is decided by how a batch is formed
// (formBatch): organisations take turns, so one organisation's backlog does
// not hold another's start for more than a statement. A batch's starts are
// answered one by one, as soon as each is decided (answer).
type startBatcher struct {
	db      *gorm.DB
	timeout time.Duration
	// stallAfter is startStall (tests may lengthen it).
	stallAfter time.Duration
	mu         sync.Mutex
	queue      []*startReq
	// active counts the writers, stalled those of them whose statement
	// has run longer than stallAfter.
	active, stalled int
	// observe, when set, is told about each statement (SetStartObserver).
	observe func(waited []time.Duration, statement time.Duration)
}

func (b *startBatcher) submit(r *startReq) {
	b.mu.Lock()
	b.queue = append(b.queue, r)
	spawn := b.active < startWriters && (b.active == b.stalled || len(b.queue) >= startBatchMax)
	if spawn {
		b.active++
	}
	b.mu.Unlock()
	if spawn {
		go b.write()
	}
}

// write is a writer: it sends batch after batch until next ends it.
func (b *startBatcher) write() {
	var st *writerStall // the last statement's
	for {
		batch, this := b.next(st)
		if batch == nil {
			return
		}
		st = this
		timer := time.AfterFunc(b.stallAfter, func() { b.stalledWriter(this) })
		b.send(batch)
		timer.Stop()
	}
}

// next ends a writer's last statement (nil: none yet) and forms its next
// batch, or ends the writer (nil). Less than a full batch is left for the
// next writer at work to end its statement: fuller statements, fewer.
func (b *startBatcher) next(last *writerStall) ([]*startReq, *writerStall) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if last != nil {
		last.ended = true
		if last.stalled {
			b.stalled--
		}
	}
	if len(b.queue) == 0 || b.active-b.stalled > 1 && len(b.queue) < startBatchMax {
		b.active--
		return nil, nil
	}
	var batch []*startReq
	batch, b.queue = formBatch(b.queue, startBatchMax)
	return batch, &writerStall{}
}

// formBatch takes up to max starts from queue, organisations in turn (in
// the order of their oldest start, each its oldest start first), and
// returns them with the rest of the queue, in order, in queue's array. An
// organisation alone fills the batch; with others waiting, it gets its
// share and they get theirs. Two starts of one key never share a
// statement: the later stays queued, and finds the first's row or lock in
// the next.
func formBatch(queue []*startReq, max int) (batch, rest []*startReq) {
	// Each organisation's starts, by their places in the queue.
	var turns [][]int
	turnOf := map[string]int{}
	for i, r := range queue {
		t, ok := turnOf[r.p.OrgID]
		if !ok {
			t = len(turns)
			turnOf[r.p.OrgID] = t
			turns = append(turns, nil)
		}
		turns[t] = append(turns[t], i)
	}
	taken := make([]bool, len(queue))
	locks := map[int64]bool{}
	// take moves the oldest start of turn t that can go into the batch.
	take := func(t int) bool {
		for len(turns[t]) > 0 {
			i := turns[t][0]
			turns[t] = turns[t][1:]
			if k := queue[i].k; k != nil {
				if locks[k.LockID] {
					continue
				}
				locks[k.LockID] = true
			}
			taken[i] = true
			batch = append(batch, queue[i])
			return true
		}
		return false
	}
	for more := true; more && len(batch) < max; {
		more = false
		for t := range turns {
			if len(batch) < max && take(t) {
				more = true
			}
		}
	}
	rest = queue[:0]
	for i, r := range queue {
		if !taken[i] {
			rest = append(rest, r)
		}
	}
	clear(queue[len(rest):])
	return batch, rest
}

// writerStall is a writer's statement, for the timer that counts it
// stalled (guarded by the batcher's mu).
type writerStall struct{ stalled, ended bool }

// stalledWriter counts a statement that has run stallAfter as stalled;
// when no writer is then at work and starts wait, one more takes them.
func (b *startBatcher) stalledWriter(st *writerStall) {
	b.mu.Lock()
	if st.ended {
		b.mu.Unlock()
		return
	}
	st.stalled = true
	b.stalled++
	spawn := len(b.queue) > 0 && b.active == b.stalled && b.active < startWriters
	if spawn {
		b.active++
	}
	b.mu.Unlock()
	if spawn {
		go b.write()
	}
}

// send writes one batch and answers its starts. A statement refused as a
// whole wrote nothing: its starts go to the transactional path
// (NotDone), which decides each alone, unless the refusal would
// meet each of them again there (the database unreachable or out of time,
// an outcome unknown): then it is their answer.
func (b *startBatcher) send(batch []*startReq) {
	began := time.Now()
	rest, err := b.exec(batch)
	if b.observe != nil {
		waited := make([]time.Duration, len(batch))
		for i, r := range batch {
			waited[i] = began.Sub(r.queued)
		}
		b.observe(waited, time.Since(began))
	}
	for _, r := range rest {
		switch {
		case err == nil:
		case IsUnavailable(err) || IsTimeout(err):
			r.err = err
		default:
			r.res = idempotency.Result{Kind: idempotency.NotDone}
		}
	}
	b.answer(rest)
}

// answer lets the requests of decided starts go on.
func (b *startBatcher) answer(starts []*startReq) {
	for _, r := range starts {
		close(r.done)
	}
}

// exec sends one statement of starts (batchWrite) and reads what it
// decided. It returns the starts not answered early by their keys, with
// the error that refused the statement.
func (b *startBatcher) exec(batch []*startReq) (rest []*startReq, err error) {
	cols := newStartColumns(len(batch))
	for _, r := range batch {
		cols.add(r.p, r.k)
	}
	tctx, end := tracedBatch(batch)
	defer end()
	ctx, cancel := context.WithTimeout(tctx, b.timeout+txGrace)
	defer cancel()
	w := &batchWrite{b: b, batch: batch, early: make([]bool, len(batch))}
	err = withConn(ctx, b.db, func(c *pgx.Conn) error { return w.send(ctx, c, cols) })
	for i, r := range batch {
		if !w.early[i] {
			rest = append(rest, r)
		}
	}
	return rest, w.refusal(rest, err)
}

// batchWrite is one statement of starts under way.
type batchWrite struct {
	b     *startBatcher
	batch []*startReq
	// early marks the starts answered by their keys' locks or rows.
	early []bool
	// rows counts start_batch.sql's rows; sent: a statement reached the
	// server, so that a lost answer leaves the outcome unknown.
	rows int
	sent bool
}

// send pipes the batch's statements in one implicit transaction and one
// round trip: its settings; its keys' locks, flushed, so that a start
// whose key is taken or answered goes on before the batch waits on
// anything (a lock, a full disk); then the starts.
func (w *batchWrite) send(ctx context.Context, c *pgx.Conn, cols *startColumns) error {
	opt := optionsOf(w.b.db)
	// The answers have their own short deadline (DATABASE_ANSWER_TIMEOUT),
	// as a request transaction's first round trip does: a hung database
	// is a 503 in seconds.
	actx, cancel := stallBound(ctx, opt.AnswerTimeout)
	defer cancel()
	q := startPipe(actx, c, !opt.TransactionPooler)
	settings := []any{strconv.FormatInt(max(w.b.timeout.Milliseconds(), 1), 10), clientCheckMS}
	err := q.query(startSettingsSQL, settings, func(pgx.Rows) error { return nil }, false)
	if err == nil && cols.keyed {
		err = q.query(startLocksSQL, cols.keyArgs(), w.readLocks, true)
	}
	if err == nil && slices.Contains(w.early, false) {
		err = q.query(startBatchSQL, cols.args(), w.readStarts, false)
	}
	err = q.sync(err)
	w.sent = q.sent
	return stalled(ctx, actx, err)
}

// start is the batch's start numbered i (1-based), as the statements
// number them.
func (w *batchWrite) start(i int64) (*startReq, error) {
	if i < 1 || int(i) > len(w.batch) {
		return nil, fmt.Errorf("start batch: row %d of %d", i, len(w.batch))
	}
	return w.batch[i-1], nil
}

// readLocks reads start_locks.sql's rows and answers at once each start
// whose key has a live row, or whose key's lock another request holds.
func (w *batchWrite) readLocks(rows pgx.Rows) error {
	var answered []*startReq
	for rows.Next() {
		var (
			i    *int64
			held *bool
		)
		st, expired, err := scanKey(rows, &i, &held)
		if err != nil {
			return err
		}
		if i == nil {
			continue // the settings' row: no start answered yet
		}
		r, err := w.start(*i)
		if err != nil {
			return err
		}
		if r.res.Kind = keyState(st, expired, *held); r.res.Kind == idempotency.NotDone {
			continue
		}
		if st != nil {
			st.Tenant, st.Scope, st.LockID = r.k.Tenant, r.k.Scope, r.k.LockID
		}
		r.res.Key = st
		w.early[*i-1] = true
		answered = append(answered, r)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	w.b.answer(answered)
	return nil
}

// readStarts reads start_batch.sql's rows into the results of the starts
// not answered early.
func (w *batchWrite) readStarts(rows pgx.Rows) error {
	for rows.Next() {
		var (
			i                          int64
			outcome                    string
			expires, created, lexpires *time.Time
			replaced                   *bool
			key, method, path, reqID   *string
			resource                   *string
			status                     *int
			st                         idempotency.Key
		)
		if err := rows.Scan(&i, &outcome, &expires, &replaced, &key, &st.RequestHash, &method,
			&path, &status, &st.Body, &st.Headers, &resource,
			&reqID, &created, &lexpires); err != nil {
			return err
		}
		r, err := w.start(i)
		if err != nil {
			return err
		}
		w.rows++
		if w.early[i-1] {
			continue
		}
		switch outcome {
		case "done":
			r.res = idempotency.Result{Kind: idempotency.Committed, Key: r.k, Replaced: replaced != nil && *replaced}
			if expires != nil && r.k != nil {
				r.k.ExpiresAt = *expires
			}
		case "stored":
			st.Tenant, st.Scope, st.LockID = r.k.Tenant, r.k.Scope, r.k.LockID
			st.Key, st.Method, st.Path, st.RequestID = *key, *method, *path, *reqID
			st.Status, st.CreatedAt, st.ExpiresAt = *status, *created, *lexpires
			if resource != nil {
				st.ResourceID = *resource
			}
			r.res = idempotency.Result{Kind: idempotency.KeyAnswered, Key: &st}
		case "inflight":
			r.res = idempotency.Result{Kind: idempotency.KeyInFlight}
		default:
			r.res = idempotency.Result{Kind: idempotency.NotDone}
		}
	}
	return rows.Err()
}

// refusal is the error that refused the statement, as the starts' callers
// read it; the starts not answered early (rest) then have no result.
func (w *batchWrite) refusal(rest []*startReq, err error) error {
	switch {
	case err != nil:
		for _, r := range rest {
			r.res = idempotency.Result{}
		}
		if w.sent && inDoubt(err) {
			// The statement reached the server, and its answer did not
			// come back: it may have committed.
			return fmt.Errorf("start run: %w: %w", ErrOutcomeUnknown, err)
		}
		if errors.Is(err, ErrStalled) {
			return fmt.Errorf("start run: %w", err)
		}
		return fmt.Errorf("start run: %w", translate(err))
	case len(rest) > 0 && w.rows != len(w.batch):
		// Committed, with a start's answer missing: what it wrote is unknown.
		return fmt.Errorf("start run: %w: %d answers for %d starts", ErrOutcomeUnknown, w.rows, len(w.batch))
	}
	return nil
}

// tracedBatch is the context a batch's statement runs in, without the
// requests' deadlines (the statement has its own), for the spans of the
// pool's tracer: they are made under a recorded span only. A lone start's
// statement is a child of its request's span; a statement that carries
// the starts of several requests is a trace of its own, its root span
// "start batch" linking each traced request's span.
// end ends that root span. Tracing off: no span, nothing allocated.
func tracedBatch(batch []*startReq) (ctx context.Context, end func()) {
	ctx, end = context.Background(), func() {}
	var links []trace.Link
	var first trace.Span
	for _, r := range batch {
		if r.span != nil {
			if first == nil {
				first = r.span
			}
			links = append(links, trace.Link{SpanContext: r.span.SpanContext()})
		}
	}
	switch {
	case first == nil:
		return ctx, end
	case len(batch) == 1:
		return trace.ContextWithSpan(ctx, first), end
	}
	ctx, span := first.TracerProvider().Tracer(tracerScope).Start(ctx, "start batch", trace.WithNewRoot(),
		trace.WithLinks(links...), trace.WithAttributes(attribute.Int("valruns.batch.starts", len(batch))))
	return ctx, func() { span.End() }
}

// tracerScope is the instrumentation scope of the models package's own spans.
const tracerScope = "github.com/valruns/valruns/models"

// The start's statements (sql/start_locks.sql, sql/start_batch.sql).
var (
	startLocksSQL = statement("start_locks")
	startBatchSQL = statement("start_batch")
)

// startSettingsSQL sets a batch of starts: its statement_timeout, its
// client_connection_check_interval, and a generic plan for startLocksSQL
// and startBatchSQL, all local to the batch's implicit transaction.
// PostgreSQL would otherwise plan both afresh at each execution (it always
// estimates a custom plan cheaper than the generic one), and planning the
// start statement costs more than executing it for a lone start. Every
// plan either can take is index lookups per start, whatever the batch's
// size (TestStartBatchPlanIsGeneric).
var startSettingsSQL = statement("start_settings")

// txGrace lets a statement's statement_timeout fire before its context's
// deadline does (see idempotency.Config.TxTimeout).
const txGrace = 2 * time.Second

// StartOne starts a run by the fast path (see startBatchSQL), with its key
// row when k is set, and says what it did as a wrapped request's one step
// does (idempotency.Prepared.Commit). It waits for its statement, whatever
// ctx does: the statement has its own deadline, and its outcome must be
// known to answer.
//
// NotDone: nothing was written; the start goes to the transactional path
// (RunStore.Start in a RequestTx). Only these starts need it: a workflow
// that is not the organisation's (its 404 is stored with the key); no
// usage slot with room for the organisation's starts of the statement (a
// new month or quota, whose slots must be rebalanced; the quota's edge,
// whose 429 is stored; every slot held elsewhere); and a statement refused
// as a whole for what one of its starts did (a key another request
// finished after the statement looked, a deadlock), which each start's own
// transaction then decides alone. Besides these, only a start whose body
// is refused with an answer to store takes that path, decided before any
// statement.
func (s *RunStore) StartOne(ctx context.Context, p StartParams, k *idempotency.Key) (idempotency.Result, error) {
	r := &startReq{queued: time.Now(), p: p, k: k, done: make(chan struct{})}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		r.span = span
	}
	s.batcher.submit(r)
	<-r.done
	return r.res, r.err
}
