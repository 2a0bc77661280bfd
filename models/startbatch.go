package models

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"
)

// The start's fast path. A start is nearly always one statement in one
// round trip, in autocommit: it takes the key's lock, checks the key and
// the workflow, bills a usage slot, and writes the key row with its answer
// and the run, all or nothing. Concurrent starts share that statement: a
// few writers each send whatever starts are waiting, up to startBatchMax,
// as one statement over arrays (startBatchSQL). PostgreSQL's work per start
// then shrinks to its rows, without a statement, a round trip and a commit
// (one WAL flush) of its own; at low load a start goes alone, at once.
//
// The answer is rendered before the SQL: the run's id (UUIDv7, so new runs
// land at the right edge of the primary key) and creation time are made
// here. Whatever the statement cannot decide alone (an unknown workflow, a
// new month or quota to rebalance, the quota's edge, an error), it leaves
// to the transactional slow path (RunStore.Start on a RequestTx).

// NewRunID makes a run's id: a UUIDv7, time-ordered.
func NewRunID() string { return uuid.Must(uuid.NewV7()).String() }

// NewRunTime is a run's creation time as stored (microseconds, UTC).
func NewRunTime() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// KeyWrite is the finished key row a keyed start writes with its run.
type KeyWrite struct {
	Endpoint, Key string
	LockID        int64
	RequestHash   []byte
	Method, Path  string
	Status        int
	Body          []byte
	// Headers is the JSON object of the stored headers.
	Headers                        []byte
	RequestID, ClientIP, UserAgent string
	TTL                            time.Duration
}

// OneResult is what the fast path did with one start; exactly one of Done,
// InFlight, Stored and Slow holds.
type OneResult struct {
	// Done: the run (and its key row) committed; Expires is when the key
	// expires, Replaced whether it took over an expired row.
	Done     bool
	Expires  time.Time
	Replaced bool
	// InFlight: another request holds the key.
	InFlight bool
	// Stored is the live key row that answers the request.
	Stored *StoredKey
	// Slow: nothing was written; take the transactional path.
	Slow bool
}

const (
	// startBatchMax is the most starts one statement carries.
	startBatchMax = 64
	// startWriters is the most statements of starts under way at once.
	// One writer sends while the starts wait in no more than a batch: the
	// starts that arrive while its statement runs go together in its next,
	// as a group commit would. PostgreSQL's work is mostly per statement
	// (its executor, its commit), so on a busy database fewer, fuller
	// statements start more runs: on two cores, one writer started 1.1-1.4x
	// the starts of four at 4, 8 and 32 clients. Another writer joins when a
	// full batch waits behind the writers at work, or when every writer at
	// work has been on its statement longer than startStall.
	startWriters = 4
	// startStall is how long a statement of starts runs before its writer
	// counts as stalled (a lock, a slow disk): a start that then finds no
	// other writer at work gets one of its own, so that one stuck statement
	// does not hold every start. Far longer than a statement takes under
	// load (a few milliseconds), so that it never splits batches.
	startStall = 50 * time.Millisecond
	// expressWriters is how many more statements may be under way for the
	// starts of organisations that have none queued or being written,
	// while a crowding organisation's starts keep the writers busy and the
	// start would wait in the queue: each goes alone, at once, instead of
	// waiting behind that organisation's batches (issue 16: one tenant's
	// flood must not set another's start latency).
	expressWriters = 2
	// crowdingStarts is how many starts an organisation has queued or
	// being written when it crowds the batcher. While none does, every
	// start waits its turn in the queue, however many organisations share
	// it: when many organisations each send a few starts, express
	// statements of one start each would only add statements, and
	// PostgreSQL's work, where one batch serves all.
	crowdingStarts = 4
)

type startReq struct {
	// queued is when the start was submitted.
	queued time.Time
	p      StartParams
	k      *KeyWrite
	done   chan struct{}
	res    OneResult
	err    error
	// span is the request's span, when it is recorded (tracing on):
	// the statement's spans join its trace (tracedBatch).
	span trace.Span
}

// startBatcher sends waiting starts in batches. Writers exist only while
// there is work, and as few as keep up (startWriters): a start that finds
// no writer at work (none, or each stalled: startStall) starts one, and so
// does a start that completes a full batch in the queue; a writer ends
// when it finds nothing waiting, or less than a full batch while another
// writer is at work. A start of an organisation with nothing in the
// batcher that would wait in the queue while another organisation crowds
// it (crowdingStarts) goes alone, by an express writer, when fewer than
// expressWriters are.
//
// It is not the worker's generic batcher (tasks/batcher.go), and could not
// be without that one growing the start path's rules into its API (models
// cannot import tasks, so it would also have to move to a package both
// import). The generic one takes the first max items in arrival order and
// releases every caller of a batch together, once its flush returns. A
// batch of starts differs in three ways:
//   - it is chosen, not cut: two starts of one key never share a
//     statement (the second waits for the next, where it finds the first's
//     row or lock), so a writer skips queued starts and leaves them queued
//     out of order;
//   - its starts are answered one by one, as soon as each is decided: those
//     answered by start_locks.sql (a live row, a lock held elsewhere) go on
//     before start_batch.sql has run, and after a failed statement each
//     start is retried, and answered, alone;
//   - admission depends on what is in it: orgs counts each organisation's
//     starts until they are answered, and a light organisation's start
//     skips the queue by an express writer when every writer is busy and
//     another organisation crowds the batcher.
//
// The one shape the two share, writers that exist only while work waits, is
// a dozen lines.
type startBatcher struct {
	db      *gorm.DB
	timeout time.Duration
	// stallAfter is startStall (tests may lengthen it).
	stallAfter time.Duration
	mu         sync.Mutex
	queue      []*startReq
	// active counts the writers, stalled those of them whose statement
	// has run longer than startStall.
	active, stalled int
	express         int
	// orgs counts each organisation's starts queued or being written;
	// crowding is how many organisations have crowdingStarts or more.
	orgs     map[string]int
	crowding int
	// observe, when set, is told about each statement (SetStartObserver).
	observe func(waited []time.Duration, statement time.Duration)
}

func (b *startBatcher) submit(r *startReq) {
	b.mu.Lock()
	light := b.orgs[r.p.OrgID] == 0
	if b.orgs[r.p.OrgID]++; b.orgs[r.p.OrgID] == crowdingStarts {
		b.crowding++
	}
	spawn := b.active < startWriters && (b.active == b.stalled || len(b.queue)+1 >= startBatchMax)
	if light && b.crowding > 0 && !spawn && b.express < expressWriters {
		b.express++
		b.mu.Unlock()
		go func() {
			b.send([]*startReq{r})
			b.mu.Lock()
			b.express--
			b.mu.Unlock()
		}()
		return
	}
	b.queue = append(b.queue, r)
	if spawn {
		b.active++
	}
	b.mu.Unlock()
	if spawn {
		go b.write()
	}
}

func (b *startBatcher) write() {
	var st *writerStall // the last statement's
	for {
		b.mu.Lock()
		if st != nil {
			st.ended = true
			if st.stalled {
				b.stalled--
			}
		}
		// Less than a full batch waits for the next writer at work to end
		// its statement: fuller statements, fewer of them.
		if len(b.queue) == 0 || b.active-b.stalled > 1 && len(b.queue) < startBatchMax {
			b.active--
			b.mu.Unlock()
			return
		}
		// Two starts of one key never share a statement: the second waits
		// for the next one, where it finds the first's row (or its lock).
		batch := make([]*startReq, 0, min(len(b.queue), startBatchMax))
		locks := map[int64]bool{}
		rest := b.queue[:0]
		for _, r := range b.queue {
			dup := r.k != nil && locks[r.k.LockID]
			if dup || len(batch) == startBatchMax {
				rest = append(rest, r)
				continue
			}
			if r.k != nil {
				locks[r.k.LockID] = true
			}
			batch = append(batch, r)
		}
		clear(b.queue[len(rest):])
		b.queue = rest
		this := &writerStall{}
		st = this
		b.mu.Unlock()
		timer := time.AfterFunc(b.stallAfter, func() { b.stalledWriter(this) })
		b.send(batch)
		timer.Stop()
	}
}

// writerStall is a writer's statement, for the timer that counts it
// stalled (guarded by the batcher's mu).
type writerStall struct{ stalled, ended bool }

// stalledWriter counts a statement that has run startStall as stalled;
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

// send runs one batch; when it fails for another reason than an
// unreachable database or an outcome it cannot know, each start not yet
// answered is tried alone, so one bad start (or a key another request
// finished meanwhile) fails alone.
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
	if err != nil && len(rest) > 1 && !IsUnavailable(err) && !errors.Is(err, ErrOutcomeUnknown) {
		for _, r := range rest {
			for try := 1; ; try++ {
				left, err := b.exec([]*startReq{r})
				if len(left) == 0 {
					break // answered by its key's lock or row
				}
				if err == nil || !isDeadlock(err) || try == 5 {
					r.err = err
					b.answer([]*startReq{r})
					break
				}
			}
		}
		return
	}
	for _, r := range rest {
		if err != nil {
			r.err = err
		}
	}
	b.answer(rest)
}

// answer forgets the starts of a statement that has ended, then lets
// their requests go on: forgotten first, so that a client's next start,
// sent once it has its answer, is counted afresh.
func (b *startBatcher) answer(batch []*startReq) {
	if len(batch) == 0 {
		return
	}
	b.mu.Lock()
	for _, r := range batch {
		if b.orgs[r.p.OrgID] == crowdingStarts {
			b.crowding--
		}
		if b.orgs[r.p.OrgID]--; b.orgs[r.p.OrgID] <= 0 {
			delete(b.orgs, r.p.OrgID)
		}
	}
	b.mu.Unlock()
	for _, r := range batch {
		close(r.done)
	}
}

// exec runs a batch: with keyed starts, first their keys' locks
// (startLocksSQL), whose answers let the starts whose key is taken or
// answered go on at once (answered here), then the others (startBatchSQL),
// in one implicit transaction and one round trip (pipe). It returns the
// starts it did not answer, with the error that stopped them.
func (b *startBatcher) exec(batch []*startReq) (rest []*startReq, err error) {
	n := len(batch)
	cols := newStartColumns(n)
	for _, r := range batch {
		cols.add(r.p, r.k)
	}
	tctx, end := tracedBatch(batch)
	defer end()
	ctx, cancel := context.WithTimeout(tctx, b.timeout+txGrace)
	defer cancel()
	settings := []any{strconv.FormatInt(max(b.timeout.Milliseconds(), 1), 10), clientCheckMS}
	early := map[int]bool{} // the starts answered by their key's lock or row
	seen := 0
	sent := false
	err = withConn(ctx, b.db, func(c *pgx.Conn) error {
		// The answers have their own short deadline (DATABASE_ANSWER_TIMEOUT),
		// as a request transaction's first round trip does: a hung
		// database is a 503 in seconds.
		actx, cancel := stallBound(ctx, optionsOf(b.db).AnswerTimeout)
		defer cancel()
		q := startPipe(actx, c, !optionsOf(b.db).TransactionPooler)
		err := q.query(startSettingsSQL, settings, func(pgx.Rows) error { return nil }, false)
		if err == nil && cols.keyed {
			// The keys' locks first, flushed: a start whose key another
			// request holds, or whose key's row answers it, is answered
			// before this batch waits on anything (a lock, a full disk).
			err = q.query(startLocksSQL, []any{cols.orgs, cols.endpoints, cols.keys, cols.locks}, func(rows pgx.Rows) error {
				var answered []*startReq
				for rows.Next() {
					var (
						i    *int64
						held *bool
						st   StoredKey
					)
					if err := scanKey(rows, &st, &i, &held); err != nil {
						return err
					}
					if i == nil {
						continue // the settings' row: no start answered yet
					}
					if *i < 1 || int(*i) > n {
						return fmt.Errorf("start batch: key %d of %d", *i, n)
					}
					r := batch[*i-1]
					switch {
					case st.Found() && !st.Expired:
						st.OrgID, st.Endpoint = r.p.OrgID, r.k.Endpoint
						r.res = OneResult{Stored: &st}
					case !*held:
						r.res = OneResult{InFlight: true}
					default:
						continue
					}
					early[int(*i)] = true
					answered = append(answered, r)
				}
				if err := rows.Err(); err != nil {
					return err
				}
				b.answer(answered)
				return nil
			}, true)
		}
		if err == nil && len(early) < n {
			err = q.query(startBatchSQL, cols.args(), func(rows pgx.Rows) error {
				for rows.Next() {
					var (
						i                          int64
						outcome                    string
						expires, created, lexpires *time.Time
						replaced                   *bool
						key, method, path, reqID   *string
						status                     *int
						st                         StoredKey
					)
					if err := rows.Scan(&i, &outcome, &expires, &replaced, &key, &st.RequestHash, &method,
						&path, &status, &st.ResponseBody, &st.ResponseHeaders, &st.ValidationRunID,
						&reqID, &created, &lexpires); err != nil {
						return err
					}
					if i < 1 || int(i) > n {
						return fmt.Errorf("start batch: row %d of %d", i, n)
					}
					seen++
					if early[int(i)] {
						continue
					}
					res := &batch[i-1].res
					switch outcome {
					case "done":
						res.Done = true
						if expires != nil {
							res.Expires = *expires
						}
						res.Replaced = replaced != nil && *replaced
					case "stored":
						st.OrgID, st.Endpoint = batch[i-1].p.OrgID, batch[i-1].k.Endpoint
						st.Key, st.RequestMethod, st.RequestPath, st.RequestID = *key, *method, *path, *reqID
						st.ResponseStatus, st.CreatedAt, st.ExpiresAt = *status, *created, *lexpires
						res.Stored = &st
					case "inflight":
						res.InFlight = true
					default:
						res.Slow = true
					}
				}
				return rows.Err()
			}, false)
		}
		err = q.sync(err)
		sent = q.sent
		return stalled(ctx, actx, err)
	})
	for i, r := range batch {
		if !early[i+1] {
			rest = append(rest, r)
		}
	}
	switch {
	case err != nil:
		for _, r := range rest {
			r.res = OneResult{}
		}
		if sent && inDoubt(err) {
			// The statement reached the server, and its answer did not
			// come back: it may have committed (ErrOutcomeUnknown).
			return rest, fmt.Errorf("start run: %w: %w", ErrOutcomeUnknown, err)
		}
		if errors.Is(err, ErrStalled) {
			return rest, fmt.Errorf("start run: %w", err)
		}
		return rest, fmt.Errorf("start run: %w", translate(err))
	case len(rest) > 0 && seen != n:
		return rest, fmt.Errorf("start run: %d answers for %d starts", seen, n)
	}
	return rest, nil
}

// tracedBatch is the context a batch's statement runs in, without the
// requests' deadlines (the statement has its own), for the spans of the
// pool's tracer: they are made under a recorded span only. A lone start's
// statement is a child of its request's span; a statement that carries
// the starts of several requests is a trace of its own, its root span
// "start batch" linking each traced request's span, as a batch task does.
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
//
// The generic plan: PostgreSQL plans a prepared statement afresh at each
// execution (a custom plan) while it estimates a custom plan cheaper than
// the generic one, and for both statements it always does. Planning
// startBatchSQL took 0.56 ms at each execution, longer than executing it
// for a lone start (0.3 ms); its generic plan is made once per connection
// and costs 0.06 ms to reuse (EXPLAIN ANALYZE EXECUTE, twelve lone
// starts). startLocksSQL was planned afresh too, at every keyed batch,
// while it set the plan_cache_mode itself (its own plan was made before
// that). Every plan either can take is index lookups per start, whatever
// the batch's size (TestStartBatchPlanIsGeneric).
var startSettingsSQL = statement("start_settings")

// txGrace lets a statement's statement_timeout fire before its context's
// deadline does (see idempotency.Config.TxTimeout).
const txGrace = 2 * time.Second

// StartOne starts a run by the fast path (see startBatchSQL), with its key
// row when k is set. It waits for its statement, whatever ctx does: the
// statement has its own deadline, and its outcome must be known to answer.
func (s *RunStore) StartOne(ctx context.Context, p StartParams, k *KeyWrite) (OneResult, error) {
	r := &startReq{queued: time.Now(), p: p, k: k, done: make(chan struct{})}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		r.span = span
	}
	s.batcher.submit(r)
	<-r.done
	return r.res, r.err
}

// startColumns are a batch's starts as start_batch.sql takes them: one
// array per column ($1 to $24), one element per start, in the batch's
// order.
type startColumns struct {
	ids, orgs, wfs, tokens                   []pgtype.UUID // a null token: none
	subs, metas, reqIDs                      []string
	created, periods                         []time.Time
	quotas, ttls                             []int64
	locks                                    []*int64
	offs, statuses                           []int32
	keys, endpoints                          []*string
	methods, paths, headers, krids, ips, uas []string
	hashes, bodies                           [][]byte
	// keyed: a start of the batch has a key.
	keyed bool
}

func newStartColumns(n int) *startColumns {
	return &startColumns{
		ids: make([]pgtype.UUID, 0, n), orgs: make([]pgtype.UUID, 0, n), wfs: make([]pgtype.UUID, 0, n),
		tokens: make([]pgtype.UUID, 0, n), subs: make([]string, 0, n),
		metas: make([]string, 0, n), reqIDs: make([]string, 0, n), created: make([]time.Time, 0, n),
		periods: make([]time.Time, 0, n), quotas: make([]int64, 0, n), ttls: make([]int64, 0, n),
		locks: make([]*int64, 0, n), offs: make([]int32, 0, n), statuses: make([]int32, 0, n),
		keys: make([]*string, 0, n), endpoints: make([]*string, 0, n),
		methods: make([]string, 0, n), paths: make([]string, 0, n), headers: make([]string, 0, n),
		krids: make([]string, 0, n), ips: make([]string, 0, n), uas: make([]string, 0, n),
		hashes: make([][]byte, 0, n), bodies: make([][]byte, 0, n),
	}
}

// add appends a start: its run p and its key row k (nil: no key).
func (c *startColumns) add(p StartParams, k *KeyWrite) {
	meta := "{}"
	if len(p.Metadata) > 0 {
		meta = string(p.Metadata)
	}
	c.ids, c.orgs, c.wfs = append(c.ids, uuidArg(p.ID)), append(c.orgs, uuidArg(p.OrgID)), append(c.wfs, uuidArg(p.WorkflowID))
	c.subs, c.metas, c.reqIDs = append(c.subs, string(p.Submission)), append(c.metas, meta), append(c.reqIDs, truncate(p.RequestID, 200))
	c.created, c.periods = append(c.created, p.CreatedAt), append(c.periods, UsagePeriod(p.CreatedAt))
	c.quotas, c.offs, c.tokens = append(c.quotas, p.Quota), append(c.offs, int32(slotOffset())), append(c.tokens, uuidArg(p.TokenID))
	if k == nil {
		c.keys, c.endpoints, c.locks = append(c.keys, nil), append(c.endpoints, nil), append(c.locks, nil)
		c.hashes, c.methods, c.paths, c.statuses = append(c.hashes, []byte{}), append(c.methods, "-"), append(c.paths, "-"), append(c.statuses, 0)
		c.bodies, c.headers, c.krids = append(c.bodies, []byte{}), append(c.headers, "{}"), append(c.krids, "-")
		c.ips, c.uas, c.ttls = append(c.ips, ""), append(c.uas, ""), append(c.ttls, 0)
		return
	}
	c.keyed = true
	c.keys, c.endpoints, c.locks = append(c.keys, &k.Key), append(c.endpoints, &k.Endpoint), append(c.locks, &k.LockID)
	c.hashes, c.methods, c.paths = append(c.hashes, k.RequestHash), append(c.methods, k.Method), append(c.paths, truncate(k.Path, 2000))
	c.statuses, c.bodies, c.headers = append(c.statuses, int32(k.Status)), append(c.bodies, k.Body), append(c.headers, string(k.Headers))
	c.krids, c.ips, c.uas = append(c.krids, truncate(k.RequestID, 200)), append(c.ips, truncate(k.ClientIP, 100)), append(c.uas, truncate(k.UserAgent, 1000))
	c.ttls = append(c.ttls, k.TTL.Microseconds())
}

// args are start_batch.sql's parameters.
func (c *startColumns) args() []any {
	return []any{c.ids, c.created, c.orgs, c.wfs, c.subs, c.metas, c.quotas, c.tokens, c.reqIDs, c.keys, c.endpoints,
		c.locks, c.hashes, c.methods, c.paths, c.statuses, c.bodies, c.headers, c.krids, c.ips, c.uas, c.ttls, c.periods,
		c.offs, int32(UsageSlots)}
}
