package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/problem"
)

// Handler does a request's work on tx, the request's one transaction, and
// returns the answer. It may only write through tx: foreign work (a queue,
// an email) is staged in a table and done after commit. Whatever it wrote
// commits with its answer, 2xx or 4xx, so a handler that answers 4xx must
// do so before writing. An error, a 5xx, a panic or a refusal (Refuse)
// rolls back everything: nothing happened, nothing is stored, the key is
// free.
type Handler[T Tx] func(tx T, req Request) (Response, error)

// Prepared is a request read from its body, ready to be done: in one step
// by Commit when it can, else in the request's transaction by Handle. What
// the Preparer decoded travels in the two functions' closures, so the body
// is decoded once.
type Prepared[T Tx] struct {
	// Handle does the request in its transaction (see Handler); it is
	// required. A Preparer that refuses the body returns a Handle that
	// answers the refusal, which is then stored like any answer.
	Handle Handler[T]
	// Commit, when set, does the request in one step, without a
	// transaction of its own: it writes the work together with the key's
	// row (key; nil without a key), all or nothing, as a Tx's Commit does
	// (ErrKeyTaken included), or answers NotDone having written nothing.
	Commit func(ctx context.Context, key *Key) (Result, error)
	// Response is the answer once Commit has committed. An answer that is
	// not stored (1xx, 5xx, Refused) or a body over the limit sends the
	// request to Handle instead.
	Response Response
}

// Preparer reads a request's body, before anything is written, into a
// Prepared. An error is answered 5xx, nothing stored. It is called once per
// attempt at the request's work: again only when the request waited for
// another request with its key (Prefer: wait) that then left the key free,
// so what it makes (ids, times) is fresh each time.
type Preparer[T Tx] func(req Request) (Prepared[T], error)

// Config configures a Wrapper; its zero value takes the defaults, except
// where a field says what 0 means.
type Config struct {
	// TTL is how long a stored answer is replayed; 0 means 24h.
	TTL time.Duration
	// TxTimeout bounds the request's work, which ignores client hang-ups;
	// 0 means 30s. The store's Begin bounds each statement by it (on
	// PostgreSQL, the transaction's own statement_timeout: the server
	// cancels a statement that hangs, and the rollback frees the key before
	// the 503 is answered). The work's context deadline, TxTimeout plus
	// txGrace, is the backstop for a transaction of many slow statements.
	TxTimeout time.Duration
	// KeyRequired: a request without a key is 400 idempotency_key_missing.
	KeyRequired bool
	// RetryAfter is the Retry-After (seconds) of a 409 and of a 5xx; 0 means 1.
	RetryAfter int
	// MaxBodyBytes is the largest body accepted, the router's limit; 0 means
	// 1 MiB. A body counts at its stored size, with its numbers written out
	// in plain decimal (413 past it), and a stored answer may be at most
	// four times it (413 response_too_large, nothing done, past that).
	MaxBodyBytes int64
	// AllowEmptyBody lets a request without a body reach the handler;
	// otherwise it is 400 invalid_json and nothing is stored. A body that is
	// not a JSON object is always refused.
	AllowEmptyBody bool
	// MaxWait caps how long a request with `Prefer: wait=N` whose key is in
	// flight waits for the first one to finish; 0 disables waiting (such a
	// request is 409 at once, as without the preference).
	MaxWait time.Duration
	// MaxWaiters caps the requests waiting at once in this process; past it
	// a request is 409 at once. 0 means 64. A waiter holds nothing of the
	// store while it waits: it looks again now and then, and is woken
	// at once when the first request executes in this same process.
	//
	// The slots are shared fairly among tenants: one tenant holds at most
	// MaxWaitersPerTenant of them, and a tenant with no request waiting
	// always gets one, even when the others hold every slot; so one tenant
	// can never take waiting away from another, and at most MaxWaiters plus
	// one per tenant wait at once.
	MaxWaiters int
	// MaxWaitersPerTenant caps one tenant's share of MaxWaiters; 0 means a
	// quarter of MaxWaiters (at least 1).
	MaxWaitersPerTenant int
	// Tenant returns the organisation a request belongs to (set by the auth
	// middleware). Keys are unique per tenant and scope.
	Tenant func(*gin.Context) string
	// Log receives errors and panics; nil discards.
	Log *slog.Logger
	// Observe, when set, is told each request's scope and outcome (metrics).
	Observe func(scope, outcome string)
}

// Wrapper makes handlers idempotent. Build one with New and wrap routes
// with Wrap.
type Wrapper[T Tx] struct {
	store   Store[T]
	cfg     Config
	waiters *waitSlots   // the requests waiting on a key in flight, per tenant
	flights sync.Map     // lock id -> *flight, for keyed requests executing in this process
	recent  *recentKeys  // keys this process answered lately: their retries look first (stageLook)
	answers *answerCache // finished keys' answers this process saved or read: replays without a read (stageCached)
}

// recentKeysSize bounds recentKeys: up to twice this many keys (16 bytes each).
const recentKeysSize = 1 << 16

// New returns a Wrapper keeping its keys, and doing its routes' work, in
// store.
func New[T Tx](store Store[T], cfg Config) *Wrapper[T] {
	cfg.TTL = cmp.Or(cfg.TTL, 24*time.Hour)
	cfg.TxTimeout = cmp.Or(cfg.TxTimeout, 30*time.Second)
	cfg.RetryAfter = cmp.Or(cfg.RetryAfter, 1)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, 1<<20)
	cfg.MaxWaiters = cmp.Or(cfg.MaxWaiters, 64)
	cfg.MaxWaitersPerTenant = cmp.Or(cfg.MaxWaitersPerTenant, max(1, cfg.MaxWaiters/4))
	cfg.Log = cmp.Or(cfg.Log, slog.New(slog.DiscardHandler))
	if cfg.Observe == nil {
		cfg.Observe = func(string, string) {}
	}
	if cfg.Tenant == nil {
		panic("idempotency: Config.Tenant is required")
	}
	return &Wrapper[T]{store: store, cfg: cfg, waiters: newWaitSlots(cfg.MaxWaiters, cfg.MaxWaitersPerTenant),
		recent: newRecentKeys(recentKeysSize), answers: newAnswerCache()}
}

// call is one request going through the wrapper.
type call[T Tx] struct {
	w         *Wrapper[T]
	c         *gin.Context
	scope     string
	tenant    string
	key       string
	lockID    int64
	body      []byte
	hash      [32]byte
	canonical []byte
	requestID string
	outcome   string
	// flight is this request's claim on its key within the process
	// (claim), nil when it holds none.
	flight *flight
	// waited is the wait this request applied (Prefer: wait) while its
	// key was in flight, 0 if it did not wait (it then holds no waiting
	// slot); deadline is when that wait ends, pollCount how often it
	// looked again.
	waited    time.Duration
	deadline  time.Time
	pollCount uint
	// noBody: the route takes no body (WrapNoBody): an empty one is fine.
	noBody bool
}

// Wrap returns a gin handler running h idempotently under scope (such as
// note_create): keys are unique per (tenant, scope, key).
func (w *Wrapper[T]) Wrap(scope string, h Handler[T]) gin.HandlerFunc {
	return w.wrap(scope, handleOnly(h), false)
}

// WrapPrepared is Wrap for a route whose common case is done in one step
// (see Prepared): prep reads each request once, and whatever its Commit
// leaves NotDone, or a Prepared without Commit, goes to its Handle in a
// transaction, as with Wrap. The contract is the same either way.
func (w *Wrapper[T]) WrapPrepared(scope string, prep Preparer[T]) gin.HandlerFunc {
	return w.wrap(scope, prep, false)
}

// WrapNoBody is Wrap for a route that takes no body (such as a secret's
// rotation): a request without one reaches h, whatever AllowEmptyBody says.
// The route and its ids are the request's fingerprint (and a body, if one
// is sent).
func (w *Wrapper[T]) WrapNoBody(scope string, h Handler[T]) gin.HandlerFunc {
	return w.wrap(scope, handleOnly(h), true)
}

// handleOnly is the Preparer of a route that is always done in a
// transaction: h reads the body there.
func handleOnly[T Tx](h Handler[T]) Preparer[T] {
	return func(Request) (Prepared[T], error) { return Prepared[T]{Handle: h}, nil }
}

func (w *Wrapper[T]) wrap(scope string, prep Preparer[T], noBody bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		k := &call[T]{w: w, c: c, scope: scope, tenant: w.cfg.Tenant(c), requestID: c.GetString(problem.RequestIDKey), noBody: noBody}
		if k.requestID == "" {
			k.requestID = uuid.NewString()
		}
		k.serve(prep)
		w.cfg.Observe(scope, k.outcome)
		// The decision on the request's span, when it is traced (new,
		// replayed, in_progress, mismatch, ...).
		if span := trace.SpanFromContext(c.Request.Context()); span.IsRecording() {
			span.SetAttributes(attribute.String("idempotency.scope", scope), attribute.String("idempotency.decision", k.outcome))
		}
	}
}

// stage is where a request stands: what the wrapper does with it next.
type stage[T Tx] struct {
	kind stageKind
	// stored is the key's live row that answers the request (stageReplay).
	stored *Key
	// answer is the key's answer in this process's cache (stageCached).
	answer *answer
	// handle is the prepared request's transactional work (stageTransact).
	handle Handler[T]
}

type stageKind int

const (
	stageAnswered stageKind = iota // the request has its answer: nothing left to do
	stageLook                      // read the key's row first (a retry, or after a wait)
	stageClaim                     // take the key within this process
	stagePrepare                   // read the body; do the request in one step if it can be
	stageTransact                  // do the request in its transaction
	stageReplay                    // answer with the key's stored answer
	stageCached                    // answer with the key's stored answer, from this process's cache
	stageInFlight                  // another request holds the key: wait, or answer 409
)

// answered is the stage of a request that has its answer.
func answered[T Tx]() stage[T] { return stage[T]{kind: stageAnswered} }

// serve answers the request: it reads the key and the body, then goes from
// stage to stage, each function doing one and naming the next, until one
// has answered. A keyed request's path is cached (a key whose answer this
// process holds), or look (for a key this process answered lately), claim,
// prepare, then transact when the one step leaves the request NotDone; any
// of them may find the key answered (replay) or held (inFlight, which waits
// and looks again, or answers 409).
func (k *call[T]) serve(prep Preparer[T]) {
	if !k.readKey() || !k.readBody() {
		return
	}
	// The work is done on a context the client cannot cancel, with its own
	// deadline: a client that hangs up still gets its answer stored.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(k.c.Request.Context()), k.w.cfg.TxTimeout+txGrace)
	defer cancel()
	defer k.leave()

	s := k.first()
	for s.kind != stageAnswered {
		switch s.kind {
		case stageLook:
			s = k.look(ctx)
		case stageClaim:
			s = k.claim()
		case stagePrepare:
			s = k.prepare(ctx, prep)
		case stageTransact:
			s = k.transact(ctx, s.handle)
		case stageReplay:
			k.replay(s.stored, true)
			s = answered[T]()
		case stageCached:
			k.replayAnswer(s.answer)
			s = answered[T]()
		case stageInFlight:
			s = k.await()
		}
	}
}

// first is a request's first stage. A request without a key has nothing to
// look up or claim. A key whose answer this process holds (answerCache) is
// replayed from it, with no read of the store. Another key this process
// answered lately probably comes back as a retry: it is looked up first,
// with one read and no transaction (a replay, a 422, or a 409 while in
// flight). A first attempt goes straight to its work, which takes the key's
// lock (or finds its row) before anything else.
func (k *call[T]) first() stage[T] {
	if k.key == "" {
		k.outcome = OutcomeNoKey
		return stage[T]{kind: stagePrepare}
	}
	k.lockID = LockID(k.tenant, k.scope, k.key)
	if ans := k.cached(); ans != nil {
		return stage[T]{kind: stageCached, answer: ans}
	}
	if k.w.recent.has(k.lockID) {
		return stage[T]{kind: stageLook}
	}
	return stage[T]{kind: stageClaim}
}

// cached is the key's answer in this process's cache, or nil.
func (k *call[T]) cached() *answer {
	return k.w.answers.get(k.lockID, k.tenant, k.scope, k.key)
}

// keyRef is the request's key as a store looks it up and locks it: nil
// without a key.
func (k *call[T]) keyRef() *Key {
	if k.key == "" {
		return nil
	}
	return &Key{Tenant: k.tenant, Scope: k.scope, Key: k.key, LockID: k.lockID}
}

// look reads the key's row, without a transaction: it answers the request,
// or says whether the key is held or free to claim. After a wait, the
// answer may be in this process's cache already (its first request ran
// here), and then nothing is read.
func (k *call[T]) look(ctx context.Context) stage[T] {
	if ans := k.cached(); ans != nil {
		return stage[T]{kind: stageCached, answer: ans}
	}
	res, err := k.w.store.Lookup(ctx, k.keyRef())
	switch {
	case err != nil:
		k.fail(err)
		return answered[T]()
	case res.Kind == KeyAnswered:
		return stage[T]{kind: stageReplay, stored: res.Key}
	case res.Kind == KeyInFlight:
		return stage[T]{kind: stageInFlight}
	}
	return stage[T]{kind: stageClaim}
}

// prepare reads the request (prep) and does it in one step when the route
// can (Prepared.Commit); what that step leaves NotDone goes on to the
// transaction, with what prep read.
func (k *call[T]) prepare(ctx context.Context, prep Preparer[T]) stage[T] {
	p, err := prep(k.request())
	if err != nil {
		k.fail(err)
		return answered[T]()
	}
	if p.Commit == nil || !k.storable(p.Response) {
		return stage[T]{kind: stageTransact, handle: p.Handle}
	}
	res, err := p.Commit(ctx, k.keyRow(p.Response))
	if err == nil && res.Kind == NotDone {
		return stage[T]{kind: stageTransact, handle: p.Handle}
	}
	return k.settle(ctx, p.Response, res, err)
}

// transact does the request with h in its one transaction. With a key,
// Begin's first round trip reads the key's row and takes its lock, and the
// Commit saves the key's row with the answer along with the work; when a
// live row already answers the request, or another request holds the
// key's lock, nothing is done.
func (k *call[T]) transact(ctx context.Context, h Handler[T]) stage[T] {
	tx, res, err := k.w.store.Begin(ctx, k.w.cfg.TxTimeout, k.keyRef())
	if err != nil || res.Kind != NotDone {
		return k.settle(ctx, Response{}, res, err)
	}
	if k.key != "" {
		defer k.w.recent.add(k.lockID)
	}
	defer tx.Rollback() // after a commit, nothing to do

	resp, err := k.handle(ctx, tx, h)
	switch {
	case err != nil:
		k.fail(err)
		return answered[T]()
	case !k.storable(resp):
		tx.Rollback()
		k.answerUnstored(resp)
		return answered[T]()
	}
	res, err = tx.Commit(ctx, k.keyRow(resp))
	return k.settle(ctx, resp, res, err)
}

// settle answers with what a step did: the commit of resp's work
// (Committed, or an error), or the key found answered or held, which it
// hands on to the replay or to the wait.
func (k *call[T]) settle(ctx context.Context, resp Response, res Result, err error) stage[T] {
	switch {
	case errors.Is(err, ErrKeyTaken) && k.key != "":
		// Another request committed this key after this one looked: this
		// one's work is not written; answer with the other's.
		k.replayCommitted(ctx)
	case err != nil:
		k.fail(err)
	case res.Kind == KeyAnswered:
		return stage[T]{kind: stageReplay, stored: res.Key}
	case res.Kind == KeyInFlight:
		return stage[T]{kind: stageInFlight}
	case res.Kind == Committed:
		k.answerCommitted(resp, res)
	default:
		k.fail(fmt.Errorf("idempotency: a commit wrote nothing (result kind %d)", res.Kind))
	}
	return answered[T]()
}

// storable reports whether resp is an answer stored with its key: 2xx or
// 4xx, not refused, and not over the largest answer stored.
func (k *call[T]) storable(resp Response) bool {
	return resp.Status >= 200 && resp.Status < 500 && !resp.Refused && int64(len(resp.Body)) <= k.maxAnswer()
}

// maxAnswer is the largest answer stored: four times the largest body.
func (k *call[T]) maxAnswer() int64 { return 4 * k.w.cfg.MaxBodyBytes }

// handle calls h on tx; a panic is an error (logged with its stack).
func (k *call[T]) handle(ctx context.Context, tx T, h Handler[T]) (resp Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			k.w.cfg.Log.ErrorContext(ctx, "panic in idempotent handler",
				"scope", k.scope, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return h(tx, k.request())
}

// txGrace lets the transaction's statement_timeout (equal to TxTimeout) fire
// before the context deadline does: a statement cancelled by the server
// leaves a connection that can roll back at once, while one cancelled by the
// client is abandoned and its backend holds the key's lock until it notices.
const txGrace = 2 * time.Second
