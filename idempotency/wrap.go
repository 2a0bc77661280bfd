package idempotency

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/valruns/valruns/internal/canonjson"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// Header names of the protocol.
const (
	HeaderKey             = "Idempotency-Key"
	HeaderReplayed        = "Idempotent-Replayed"
	HeaderOriginalRequest = "Original-Request-Id"
	HeaderRequestID       = "X-Request-Id"
	// HeaderKeyExpires is on every stored and replayed answer (and on a 422):
	// when the key expires, as an HTTP-date (RFC 9110, like Expires). Until
	// then a retry is answered from the stored answer; after it, the same key
	// starts new work. The IETF draft has no such field yet (its open issue
	// #49 asks for one, as a TTL); a date stays true on every replay.
	HeaderKeyExpires = "Idempotency-Key-Expires"
	// HeaderPrefer and HeaderPreferenceApplied carry RFC 7240's wait
	// preference: a request whose key is in flight waits for the first
	// instead of being answered 409 at once.
	HeaderPrefer            = "Prefer"
	HeaderPreferenceApplied = "Preference-Applied"
)

// storedHeaders is the allowlist of response headers kept for replay. Never
// Set-Cookie or anything about authentication: a replay may reach another
// caller of the same organisation.
var storedHeaders = []string{"Content-Type", "Location"}

// The codes the wrapper answers with, as a problem document's code
// (problem.Details.Code) carries them.
var (
	CodeKeyMissing       = problem.IdempotencyKeyMissing.String()
	CodeKeyInvalid       = problem.IdempotencyKeyInvalid.String()
	CodeKeyTooLong       = problem.IdempotencyKeyTooLong.String()
	CodeKeyReused        = problem.IdempotencyKeyReused.String()
	CodeKeyInProgress    = problem.IdempotencyKeyInProgress.String()
	CodeInvalidJSON      = problem.InvalidJSON.String()
	CodeInvalidNumber    = problem.InvalidNumber.String()
	CodeBodyTooLarge     = problem.RequestBodyTooLarge.String()
	CodeResponseTooLarge = problem.ResponseTooLarge.String()
	CodeInternal         = problem.InternalError.String()
	CodeTimeout          = problem.RequestTimeout.String()
	CodeBodyTimeout      = problem.RequestBodyTimeout.String()
	CodeUnavailable      = problem.ServiceUnavailable.String()
)

// The detail of a 503 whose work's outcome is unknown (the database
// stopped answering after the commit was sent), with and without a key.
const (
	OutcomeUnknownDetail = "The database stopped answering after this request was sent to it, so whether it was done is unknown. " +
		"Retry with the same Idempotency-Key: the retry gets the first answer if it was done, and does it if not."
	OutcomeUnknownNoKeyDetail = "The database stopped answering after this request was sent to it, so whether it was done is unknown. " +
		"Without an Idempotency-Key a retry may do it twice: send one to make retries safe."
)

// Outcomes counted by the idempotency_requests_total metric. Every request
// through the wrapper is counted under exactly one.
const (
	OutcomeNew           = "new"
	OutcomeReplayed      = "replayed"
	OutcomeMismatch      = "mismatch"
	OutcomeInProgress    = "in_progress"
	OutcomeRejected      = "rejected"
	OutcomeExpiredReused = "expired_reused"
	OutcomeNoKey         = "no_key"
	OutcomeError         = "error"
)

// Outcomes lists every outcome, for metrics that start at zero.
var Outcomes = []string{OutcomeNew, OutcomeReplayed, OutcomeMismatch, OutcomeInProgress,
	OutcomeRejected, OutcomeExpiredReused, OutcomeNoKey, OutcomeError}

// Request is what a wrapped handler gets besides the transaction.
type Request struct {
	// Gin is the request's context, for path parameters and values set by
	// middleware. The handler must not write to it: it returns its answer.
	Gin *gin.Context
	// Body is the raw request body: a JSON object (or empty when the
	// wrapper allows it), whose numbers each fit models' columns.
	Body []byte
	// Key is the request's Idempotency-Key ("" without one). A handler
	// stores it on what it creates, to link the two.
	Key string
	// RequestID is the request's X-Request-Id.
	RequestID string
}

// Response is a handler's answer. 2xx and 4xx answers to a keyed request are
// stored and replayed; only Content-Type and Location of Header are kept.
type Response struct {
	Status int
	Body   []byte
	Header http.Header
	// ResourceID, when set, is the id of what the request created, stored
	// on the key row with the answer so that a key leads to its resource.
	// The key store decides what it may hold: models.KeyStore keeps it in
	// the row's link column (models.IdempotencyKey.ValidationRunID), a
	// uuid with a foreign key (ON DELETE SET NULL) to the service's one
	// linked table, so there it must be the id of a row of that table, or
	// empty. A route whose resources live elsewhere leaves it empty.
	ResourceID string
	// Refused marks a 4xx that refuses the request as a check before the
	// handler would have (Refuse): like a 5xx, the work is rolled back and
	// the answer is not stored, so the key stays free.
	Refused bool
	// AfterCommit, when set, is called once the answer has committed (never
	// for a replay, a rollback or a 5xx): work that must not happen inside
	// the transaction, such as waking a consumer of what it staged.
	AfterCommit func()
	// InDoubt, when set, is called instead when the commit was sent and
	// its outcome is unknown (models.ErrOutcomeUnknown: the request is
	// answered 503, saying so): the handler may find out later whether its
	// work committed and then do what AfterCommit would have done.
	InDoubt func()
}

// JSON builds a Response with v encoded as application/json.
func JSON(status int, v any) (Response, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "a > 0" stays readable in CEL expressions
	if err := enc.Encode(v); err != nil {
		return Response{}, fmt.Errorf("encode response: %w", err)
	}
	return Response{Status: status, Body: bytes.TrimSuffix(b.Bytes(), []byte("\n")), Header: http.Header{"Content-Type": {"application/json; charset=utf-8"}}}, nil
}

// Problem builds a Response carrying a problem document.
func Problem(req Request, d problem.Details) Response {
	d.Instance = problem.Path(req.Gin.Request)
	d.RequestID = req.RequestID
	return Response{Status: d.Status, Body: d.Body(), Header: http.Header{"Content-Type": {problem.ContentType}}}
}

// Refuse builds a Response that refuses the request with a problem
// document, rolled back and not stored (Response.Refused): for what the
// handler finds that a check before it would have refused, such as a
// credential that no longer holds.
func Refuse(req Request, d problem.Details) Response {
	resp := Problem(req, d)
	resp.Refused = true
	return resp
}

// Handler does a request's work on tx, the request's one transaction (its
// DB is a GORM session on it), and returns the answer. It may only touch
// PostgreSQL through tx: foreign work
// (a queue, an email) is staged in a table and done after commit. Whatever
// it wrote commits with its answer, 2xx or 4xx, so a handler that answers
// 4xx must do so before writing. An error, a 5xx, a panic or a refusal
// (Refuse) rolls back everything: nothing happened, nothing is stored, the
// key is free.
type Handler func(tx *models.RequestTx, req Request) (Response, error)

// Prepared is a request read from its body, ready to be done: in one step
// by Commit when it can, else in the request's transaction by Handle. What
// the Preparer decoded travels in the two functions' closures, so the body
// is decoded once.
type Prepared struct {
	// Handle does the request in its transaction (see Handler); it is
	// required. A Preparer that refuses the body returns a Handle that
	// answers the refusal, which is then stored like any answer.
	Handle Handler
	// Commit, when set, does the request in one step, without a
	// transaction of its own: it writes the work together with the key row
	// (key; nil without a key, and the row's ResourceID is Commit's to
	// write), all or nothing, and says what happened: unless it answers
	// Committed, nothing was written.
	Commit func(ctx context.Context, key *models.KeyWrite) (CommitResult, error)
	// Response is the answer once Commit has committed. An answer that is
	// not stored (1xx, 5xx, Refused) or a body over the limit sends the
	// request to Handle instead.
	Response Response
}

// CommitResult is what a Prepared's Commit did with its request.
type CommitResult struct {
	// Kind says what happened; its zero value, NeedsTransaction, that
	// nothing was written.
	Kind CommitKind
	// Expires is when the key expires (Committed, with a key).
	Expires time.Time
	// Replaced: the key row took over an expired one (Committed, with a key).
	Replaced bool
	// Stored is the key's live row, which answers the request (KeyAnswered).
	Stored *models.StoredKey
}

// CommitKind is what a Prepared's Commit did.
type CommitKind int

const (
	// NeedsTransaction: nothing was written; the request is done in its
	// transaction (Prepared.Handle) instead.
	NeedsTransaction CommitKind = iota
	// Committed: the work committed, with the key row when there is a key.
	Committed
	// KeyInFlight: nothing was written; another request holds the key.
	KeyInFlight
	// KeyAnswered: nothing was written; the key's live row (Stored)
	// answers the request.
	KeyAnswered
)

// Preparer reads a request's body, before anything is written, into a
// Prepared. An error is answered 5xx, nothing stored. It is called once per
// attempt at the request's work: again only when the request waited for
// another request with its key (Prefer: wait) that then left the key free,
// so what it makes (ids, times) is fresh each time.
type Preparer func(req Request) (Prepared, error)

// Config configures a Wrapper; its zero value takes the defaults, except
// where a field says what 0 means.
type Config struct {
	// TTL is how long a stored answer is replayed; 0 means 24h.
	TTL time.Duration
	// TxTimeout bounds the request transaction, which ignores client
	// hang-ups; 0 means 30s. It is the transaction's own statement_timeout
	// (SET LOCAL): the server cancels a statement that hangs, the connection
	// stays healthy and the rollback frees the key before the 503 is
	// answered. The transaction's context deadline, TxTimeout plus txGrace,
	// is the backstop for a transaction of many slow statements.
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
	// a request is 409 at once. 0 means 64. A waiter holds no database
	// connection while it waits: it looks again now and then, and is woken
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
type Wrapper struct {
	db      *gorm.DB
	keys    *models.KeyStore
	cfg     Config
	waiters *waitSlots   // the requests waiting on a key in flight, per tenant
	flights sync.Map     // lock id -> *flight, for keyed requests executing in this process
	recent  *recentKeys  // keys this process answered lately: their retries look first (stageLook)
	answers *answerCache // finished keys' answers this process saved or read: replays without a read (stageCached)
}

// recentKeysSize bounds recentKeys: up to twice this many keys (16 bytes each).
const recentKeysSize = 1 << 16

// flight is a keyed request executing in this process; done is closed once
// its transaction has committed or rolled back.
type flight struct{ done chan struct{} }

// New returns a Wrapper running transactions on db.
func New(db *gorm.DB, keys *models.KeyStore, cfg Config) *Wrapper {
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
	return &Wrapper{db: db, keys: keys, cfg: cfg, waiters: newWaitSlots(cfg.MaxWaiters, cfg.MaxWaitersPerTenant), recent: newRecentKeys(recentKeysSize),
		answers: newAnswerCache()}
}

// Waiting is how many requests wait at once on a key in flight
// (`Prefer: wait`), for a gauge.
func (w *Wrapper) Waiting() int { return w.waiters.count() }

// waitSlots are the places of requests waiting on a key in flight, shared
// among tenants (see Config.MaxWaiters).
type waitSlots struct {
	mu        sync.Mutex
	max, each int
	total     int
	byTenant  map[string]int
}

func newWaitSlots(max, each int) *waitSlots {
	return &waitSlots{max: max, each: each, byTenant: map[string]int{}}
}

// take reports whether tenant's request may wait, and if so holds a slot
// until give.
func (s *waitSlots) take(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.byTenant[tenant]
	if n >= s.each || (n > 0 && s.total >= s.max) {
		return false
	}
	s.byTenant[tenant] = n + 1
	s.total++
	return true
}

func (s *waitSlots) give(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.byTenant[tenant]--; s.byTenant[tenant] <= 0 {
		delete(s.byTenant, tenant)
	}
}

func (s *waitSlots) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// call is one request going through the wrapper.
type call struct {
	w         *Wrapper
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
func (w *Wrapper) Wrap(scope string, h Handler) gin.HandlerFunc {
	return w.wrap(scope, handleOnly(h), false)
}

// WrapPrepared is Wrap for a route whose common case is done in one step
// (see Prepared): prep reads each request once, and whatever its Commit
// cannot decide alone (NeedsTransaction), or a Prepared without Commit,
// goes to its Handle in a transaction, as with Wrap. The contract is the
// same either way.
func (w *Wrapper) WrapPrepared(scope string, prep Preparer) gin.HandlerFunc {
	return w.wrap(scope, prep, false)
}

// WrapNoBody is Wrap for a route that takes no body (such as a secret's
// rotation): a request without one reaches h, whatever AllowEmptyBody says.
// The route and its ids are the request's fingerprint (and a body, if one
// is sent).
func (w *Wrapper) WrapNoBody(scope string, h Handler) gin.HandlerFunc {
	return w.wrap(scope, handleOnly(h), true)
}

// handleOnly is the Preparer of a route that is always done in a
// transaction: h reads the body there.
func handleOnly(h Handler) Preparer {
	return func(Request) (Prepared, error) { return Prepared{Handle: h}, nil }
}

func (w *Wrapper) wrap(scope string, prep Preparer, noBody bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		k := &call{w: w, c: c, scope: scope, tenant: w.cfg.Tenant(c), requestID: c.GetString(problem.RequestIDKey), noBody: noBody}
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
type stage struct {
	kind stageKind
	// stored is the key's live row that answers the request (stageReplay).
	stored *models.StoredKey
	// answer is the key's answer in this process's cache (stageCached).
	answer *storedAnswer
	// handle is the prepared request's transactional work (stageTransact).
	handle Handler
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

// serve answers the request: it reads the key and the body, then goes from
// stage to stage, each function doing one and naming the next, until one
// has answered. A keyed request's path is cached (a key whose answer this
// process holds), or look (for a key this process answered lately), claim,
// prepare, then transact when the one step cannot decide it; any of them
// may find the key answered (replay) or held (inFlight, which waits and
// looks again, or answers 409).
func (k *call) serve(prep Preparer) {
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
			k.replay(s.stored)
			s = stage{kind: stageAnswered}
		case stageCached:
			k.replayAnswer(s.answer)
			s = stage{kind: stageAnswered}
		case stageInFlight:
			s = k.await()
		}
	}
}

// first is a request's first stage. A request without a key has nothing to
// look up or claim. A key whose answer this process holds (answerCache) is
// replayed from it, with no database read. Another key this process
// answered lately probably comes back as a retry: it is looked up first,
// with one read and no transaction (a replay, a 422, or a 409 while in
// flight, seen in pg_locks by the same statement). A first attempt goes
// straight to its work, which takes the key's lock (or finds its row)
// before anything else.
func (k *call) first() stage {
	if k.key == "" {
		k.outcome = OutcomeNoKey
		return stage{kind: stagePrepare}
	}
	k.lockID = models.LockID(k.tenant, k.scope, k.key)
	if ans := k.cached(); ans != nil {
		return stage{kind: stageCached, answer: ans}
	}
	if k.w.recent.has(k.lockID) {
		return stage{kind: stageLook}
	}
	return stage{kind: stageClaim}
}

// cached is the key's answer in this process's cache, or nil.
func (k *call) cached() *storedAnswer {
	return k.w.answers.get(k.lockID, k.tenant, k.scope, k.key)
}

// look reads the key's row, without a transaction: it answers the request,
// or says whether the key is held or free to claim. After a wait, the
// answer may be in this process's cache already (its first request ran
// here), and then nothing is read.
func (k *call) look(ctx context.Context) stage {
	if ans := k.cached(); ans != nil {
		return stage{kind: stageCached, answer: ans}
	}
	stored, err := k.w.keys.Lookup(ctx, k.tenant, k.scope, k.key)
	switch {
	case err != nil:
		k.fail(err)
		return stage{kind: stageAnswered}
	case stored.Found() && !stored.Expired:
		return stage{kind: stageReplay, stored: stored}
	case stored.InFlight:
		return stage{kind: stageInFlight}
	}
	return stage{kind: stageClaim}
}

// claim makes the key this process's to work on, unless one of its
// requests holds it: then this one is a duplicate in flight, known at
// once, whatever the first request waits on (docs/design.md, Proof: a
// later duplicate must never overtake the first while it waits). The
// claim ends with the work (unclaim), waking this process's requests
// waiting on the key.
func (k *call) claim() stage {
	f := &flight{done: make(chan struct{})}
	if _, held := k.w.flights.LoadOrStore(k.lockID, f); held {
		return stage{kind: stageInFlight}
	}
	k.flight = f
	return stage{kind: stagePrepare}
}

// unclaim ends this request's claim on its key, if it holds one.
func (k *call) unclaim() {
	if k.flight == nil {
		return
	}
	k.w.flights.CompareAndDelete(k.lockID, k.flight)
	close(k.flight.done)
	k.flight = nil
}

// leave gives back what the request held while it was served: its claim
// and its waiting slot.
func (k *call) leave() {
	k.unclaim()
	if k.waited > 0 {
		k.w.waiters.give(k.tenant)
	}
}

// await handles a key another request holds: 409 at once, unless the
// request asked to wait (Prefer: wait) and may; then it waits for the
// first to finish, or a while, and looks again, until its wait is over.
func (k *call) await() stage {
	k.unclaim()
	k.w.recent.add(k.lockID)
	if k.waited == 0 {
		wait := k.preferredWait()
		if wait == 0 || !k.w.waiters.take(k.tenant) { // no wait asked, or enough requests wait already
			k.inProgress()
			return stage{kind: stageAnswered}
		}
		k.waited, k.deadline = wait, time.Now().Add(wait)
		k.c.Header(HeaderPreferenceApplied, AppliedWait(wait))
	}
	if !k.waitForFlight(k.deadline) {
		k.inProgress()
		return stage{kind: stageAnswered}
	}
	return stage{kind: stageLook} // the cheap look, until the key is free
}

// readKey reads the Idempotency-Key header; false when it answered 400.
func (k *call) readKey() bool {
	raw, present := k.c.Request.Header[HeaderKey]
	switch {
	case present:
		key, err := ParseKey(raw[0])
		switch {
		case len(raw) > 1:
			k.reject(http.StatusBadRequest, problem.IdempotencyKeyInvalid, "Send exactly one Idempotency-Key header.")
			return false
		case errors.Is(err, ErrKeyTooLong):
			k.reject(http.StatusBadRequest, problem.IdempotencyKeyTooLong, "Idempotency key exceeds maximum length of 255 characters.")
			return false
		case err != nil:
			k.reject(http.StatusBadRequest, problem.IdempotencyKeyInvalid,
				"Idempotency key must be 1 to 255 printable ASCII characters, bare (abc) or as a quoted string (\"abc\").")
			return false
		}
		k.key = key
	case k.w.cfg.KeyRequired:
		k.reject(http.StatusBadRequest, problem.IdempotencyKeyMissing, "This endpoint requires an Idempotency-Key header.")
		return false
	}
	return true
}

// readBody reads and canonicalises the body and computes the request's
// fingerprint; false when it answered (4xx, nothing stored): a body that is
// too large, not JSON, empty, not an object, or holding a number the
// database cannot store as sent.
func (k *call) readBody() bool {
	body, err := io.ReadAll(k.c.Request.Body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			k.reject(http.StatusRequestEntityTooLarge, problem.RequestBodyTooLarge,
				fmt.Sprintf("The request body exceeds the limit of %d bytes.", tooBig.Limit))
			return false
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The client sent its body slower than the server's read
			// timeout: nothing was wrong with the request, and it may be
			// sent again (408, RFC 9110 15.5.9). The connection is done.
			k.c.Header("Connection", "close")
			k.reject(http.StatusRequestTimeout, problem.RequestBodyTimeout,
				"The request body did not arrive in time; nothing was done. Send the request again.")
			return false
		}
		k.reject(http.StatusBadRequest, problem.InvalidJSON, "The request body could not be read: "+err.Error()+".")
		return false
	}
	canonical, err := canonjson.CanonicalizeBounded(body, k.w.cfg.MaxBodyBytes)
	var numErr *canonjson.NumberError
	var sizeErr *canonjson.SizeError
	switch {
	case errors.As(err, &numErr):
		d := problem.New(http.StatusBadRequest, problem.InvalidNumber, "The number at "+numErr.Path+" cannot be stored as sent: "+
			fmt.Sprintf("written out in decimal it has %d digits, and at most %d are accepted.", numErr.Length, canonjson.MaxNumberLength))
		d.Errors = []problem.FieldError{{Field: numErr.Path, Message: fmt.Sprintf("number longer than %d digits in decimal", canonjson.MaxNumberLength)}}
		k.outcome = OutcomeRejected
		problem.Write(k.c, d)
		return false
	case errors.As(err, &sizeErr):
		k.reject(http.StatusRequestEntityTooLarge, problem.RequestBodyTooLarge, fmt.Sprintf(
			"With its numbers written out in decimal, as they are stored, the request body is %d bytes, over the limit of %d.",
			sizeErr.Size, sizeErr.Limit))
		return false
	case err != nil:
		k.reject(http.StatusBadRequest, problem.InvalidJSON, "The request body is not valid JSON: "+err.Error())
		return false
	case canonical == nil && !k.w.cfg.AllowEmptyBody && !k.noBody:
		k.reject(http.StatusBadRequest, problem.InvalidJSON, "The request body is empty; send a JSON object.")
		return false
	case canonical != nil && canonical[0] != '{':
		k.reject(http.StatusBadRequest, problem.InvalidJSON, "The request body must be a JSON object.")
		return false
	}
	k.body = body
	k.canonical = canonical
	k.hash = Fingerprint(k.c.Request.Method, routePath(k.c), canonical)
	return true
}

// routePath is the path a fingerprint covers: the route with its
// parameters, a UUID in its canonical lower-case form, so that the same
// request reaches the same fingerprint however a client spells the id.
func routePath(c *gin.Context) string {
	route := c.FullPath()
	if route == "" {
		return c.Request.URL.Path
	}
	parts := strings.Split(route, "/")
	for i, part := range parts {
		if name, ok := strings.CutPrefix(part, ":"); ok {
			v := c.Param(name)
			if id, err := uuid.Parse(v); err == nil {
				v = id.String()
			}
			parts[i] = v
		}
	}
	return strings.Join(parts, "/")
}

// preferredWait is how long the request may wait for its key's first
// request: the Prefer header's wait within Config.MaxWait.
func (k *call) preferredWait() time.Duration {
	return PreferredWait(k.c.Request.Header, k.w.cfg.MaxWait)
}

// PreferredWait is the wait a request asks for with RFC 7240's
// `Prefer: wait=N` (whole seconds), capped at max: 0 when it asks for none,
// when max is 0 (waiting disabled), and for a wait of 0, a negative one or a
// malformed one. Other preferences and a preference's parameters are
// ignored; an N too large for an int64 is above any cap, so it is max.
func PreferredWait(h http.Header, max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	for _, line := range h.Values(HeaderPrefer) {
		for pref := range strings.SplitSeq(line, ",") {
			token, _, _ := strings.Cut(pref, ";") // parameters of a preference are not ours
			name, value, ok := strings.Cut(strings.TrimSpace(token), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			v := strings.Trim(strings.TrimSpace(value), `"`)
			n, err := strconv.ParseInt(v, 10, 64)
			switch {
			case errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(v, "-"):
				return max // more seconds than an int64 holds: above any cap
			case err != nil || n <= 0:
				return 0
			case n > int64(max/time.Second):
				// Compared in seconds: n*time.Second overflows past
				// 9223372036 and would wrap below the cap, or below 0.
				return max
			}
			return min(time.Duration(n)*time.Second, max)
		}
	}
	return 0
}

// AppliedWait is the Preference-Applied value for a wait of d: `wait=N`,
// N its whole seconds rounded up (a cap of 1.5s applies wait=2).
func AppliedWait(d time.Duration) string {
	return "wait=" + strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// waitForFlight waits for the key's first request to finish, or a while
// before looking again (it may be in another process), and reports
// whether there is time left.
func (k *call) waitForFlight(deadline time.Time) bool {
	left := time.Until(deadline)
	if left <= 0 {
		return false
	}
	var done chan struct{}
	if f, ok := k.w.flights.Load(k.lockID); ok {
		done = f.(*flight).done
	}
	// Look again soon, then less often: each look borrows a connection
	// for one statement and gives it back.
	k.pollCount++
	pause := min(20*time.Millisecond<<min(k.pollCount, 4), 250*time.Millisecond, left)
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	return true
}

// request is what the route's functions get of the request.
func (k *call) request() Request {
	return Request{Gin: k.c, Body: k.body, RequestID: k.requestID, Key: k.key}
}

// prepare reads the request (prep) and does it in one step when the route
// can (Prepared.Commit); whatever that one step cannot decide goes on to the
// transaction, with what prep read.
func (k *call) prepare(ctx context.Context, prep Preparer) stage {
	p, err := prep(k.request())
	if err != nil {
		k.fail(err)
		return stage{kind: stageAnswered}
	}
	resp := p.Response
	if p.Commit == nil || resp.Status < 200 || resp.Status >= 500 || resp.Refused || int64(len(resp.Body)) > k.maxAnswer() {
		return stage{kind: stageTransact, handle: p.Handle}
	}
	res, err := p.Commit(ctx, k.keyWrite(resp))
	switch {
	case errors.Is(err, models.ErrConflict) && k.key != "":
		k.replayCommitted(ctx)
		return stage{kind: stageAnswered}
	case err != nil:
		k.failCommit(err, resp)
		return stage{kind: stageAnswered}
	}
	switch res.Kind {
	case Committed:
		k.answerCommitted(resp, res.Expires, res.Replaced)
		return stage{kind: stageAnswered}
	case KeyInFlight:
		return stage{kind: stageInFlight}
	case KeyAnswered:
		return stage{kind: stageReplay, stored: res.Stored}
	}
	return stage{kind: stageTransact, handle: p.Handle} // NeedsTransaction
}

// keyWrite is the key row a Prepared's Commit writes with the answer resp
// (nil without a key).
func (k *call) keyWrite(resp Response) *models.KeyWrite {
	if k.key == "" {
		return nil
	}
	row := k.keyRow(resp)
	return &models.KeyWrite{Endpoint: k.scope, Key: k.key, LockID: k.lockID, RequestHash: row.RequestHash,
		Method: row.RequestMethod, Path: row.RequestPath, Status: row.ResponseStatus, Body: row.ResponseBody,
		Headers: row.ResponseHeaders, RequestID: row.RequestID, ClientIP: row.ClientIP, UserAgent: row.UserAgent,
		TTL: k.w.cfg.TTL}
}

// maxAnswer is the largest answer stored: four times the largest body.
func (k *call) maxAnswer() int64 { return 4 * k.w.cfg.MaxBodyBytes }

// answerCommitted answers with resp, whose work has committed (with its
// key row, which expires at expires and replaced an expired one when
// replaced, if the request has a key).
func (k *call) answerCommitted(resp Response, expires time.Time, replaced bool) {
	if k.key != "" {
		k.outcome = OutcomeNew
		if replaced {
			k.outcome = OutcomeExpiredReused
		}
		k.w.recent.add(k.lockID)
		k.w.answers.put(k.savedAnswer(resp, expires))
		if resp.Header == nil {
			resp.Header = http.Header{}
		}
		resp.Header.Set(HeaderKeyExpires, expires.UTC().Format(http.TimeFormat))
	}
	if resp.AfterCommit != nil {
		resp.AfterCommit()
	}
	k.write(resp.Status, resp.Header, resp.Body)
}

// replayCommitted answers with the key row another request committed
// after this one looked (its own work was not written).
func (k *call) replayCommitted(ctx context.Context) {
	stored, err := k.w.keys.Lookup(ctx, k.tenant, k.scope, k.key)
	if err != nil {
		k.fail(err)
		return
	}
	k.replay(stored)
}

// transact does the request with h in its one transaction. With a key,
// the transaction's first round trip reads the key's row and takes its
// advisory lock, and the last saves the key row with the answer along with
// the COMMIT; when a live row already answers the request, or another
// request holds the key's lock, nothing is done (replay, inFlight).
func (k *call) transact(ctx context.Context, h Handler) stage {
	var ref *models.KeyRef
	if k.key != "" {
		ref = &models.KeyRef{OrgID: k.tenant, Endpoint: k.scope, Key: k.key, LockID: k.lockID}
	}
	tx, stored, err := models.BeginRequest(ctx, k.w.db, k.w.cfg.TxTimeout, ref)
	switch {
	case err != nil:
		k.fail(err)
		return stage{kind: stageAnswered}
	case tx == nil && stored.Found() && !stored.Expired:
		return stage{kind: stageReplay, stored: stored}
	case tx == nil:
		return stage{kind: stageInFlight}
	}
	if ref != nil {
		defer k.w.recent.add(k.lockID)
	}
	defer tx.Rollback() // after a commit, nothing to do

	resp, err := k.handle(tx, h)
	switch {
	case err != nil:
		k.fail(err)
		return stage{kind: stageAnswered}
	case resp.Status >= 500:
		// Rolled back, passed on, not stored: a retry executes afresh.
		tx.Rollback()
		k.outcome = OutcomeError
		k.write(resp.Status, resp.Header, resp.Body)
		return stage{kind: stageAnswered}
	case resp.Status < 200:
		k.fail(fmt.Errorf("handler answered %d", resp.Status))
		return stage{kind: stageAnswered}
	case resp.Refused:
		tx.Rollback()
		k.outcome = OutcomeRejected
		k.write(resp.Status, resp.Header, resp.Body)
		return stage{kind: stageAnswered}
	case int64(len(resp.Body)) > k.maxAnswer():
		tx.Rollback()
		k.reject(http.StatusRequestEntityTooLarge, problem.ResponseTooLarge, fmt.Sprintf(
			"The answer to this request would be %d bytes, over the limit of %d; nothing was done. Send a smaller request.",
			len(resp.Body), k.maxAnswer()))
		return stage{kind: stageAnswered}
	}
	var expires time.Time
	if ref == nil {
		err = tx.Commit(ctx)
	} else {
		expires, err = tx.CommitWithKey(ctx, k.keyRow(resp), k.w.cfg.TTL)
	}
	switch {
	case errors.Is(err, models.ErrConflict):
		// A request holding the lock before us committed this key after
		// our fast-path read: our work is rolled back; answer with theirs.
		k.replayCommitted(ctx)
	case err != nil:
		k.failCommit(err, resp)
	default:
		k.answerCommitted(resp, expires, ref != nil && stored.Found())
	}
	return stage{kind: stageAnswered}
}

// failCommit answers an error of the commit of resp's work (fail), and
// tells the handler when that commit's outcome is unknown (Response.InDoubt).
func (k *call) failCommit(err error, resp Response) {
	if errors.Is(err, models.ErrOutcomeUnknown) && resp.InDoubt != nil {
		resp.InDoubt()
	}
	k.fail(err)
}

// handle calls h on tx; a panic is an error (logged with its stack).
func (k *call) handle(tx *models.RequestTx, h Handler) (resp Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			k.w.cfg.Log.ErrorContext(tx.Context(), "panic in idempotent handler",
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

func (k *call) keyRow(resp Response) *models.IdempotencyKey {
	hb, _ := json.Marshal(storedHeaderMap(resp.Header)) // map[string]string cannot fail
	row := &models.IdempotencyKey{
		OrgID: k.tenant, Endpoint: k.scope, Key: k.key, RequestHash: k.hash[:],
		RequestMethod: k.c.Request.Method, RequestPath: k.c.Request.URL.Path,
		ResponseStatus: resp.Status, ResponseBody: resp.Body, ResponseHeaders: hb,
		RequestID: k.requestID, ClientIP: k.c.ClientIP(), UserAgent: k.c.Request.UserAgent(),
	}
	if resp.ResourceID != "" {
		row.ValidationRunID = &resp.ResourceID
	}
	return row
}

// sameRequest reports whether the stored fingerprint is this request's.
// Keys stored before fingerprints covered the route with normalised ids
// (at most IDEMPOTENCY_TTL ago) were fingerprinted with the path as sent:
// they match that too, so a retry across the upgrade still replays.
func (k *call) sameRequest(stored []byte) bool {
	if bytes.Equal(stored, k.hash[:]) {
		return true
	}
	legacy := Fingerprint(k.c.Request.Method, k.c.Request.URL.Path, k.canonical)
	return bytes.Equal(stored, legacy[:])
}

// differences names what of the fingerprint differs between this request
// and the one its key was first used for (ans): "method", "path", "body", or
// several, as in "path and body". The fingerprint is one hash, so each part
// is compared on its own: the method and the path (its ids made canonical,
// as a fingerprint's are) as stored, and the body by whether the stored hash
// is that of this body with the stored method and path.
func (k *call) differences(ans *storedAnswer) string {
	var parts []string
	if ans.method != k.c.Request.Method {
		parts = append(parts, "method")
	}
	path := canonicalPath(ans.path)
	if path != routePath(k.c) && ans.path != k.c.Request.URL.Path {
		parts = append(parts, "path")
	}
	same, legacy := Fingerprint(ans.method, path, k.canonical), Fingerprint(ans.method, ans.path, k.canonical)
	if !bytes.Equal(ans.requestHash, same[:]) && !bytes.Equal(ans.requestHash, legacy[:]) || len(parts) == 0 {
		parts = append(parts, "body") // len 0: a hash that differs means some part does
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// canonicalPath is a stored request path with each segment that is a UUID
// in canonical form, as routePath writes the path of a route: the stored
// path is the request's as sent.
func canonicalPath(path string) string {
	parts := strings.Split(path, "/")
	for i, part := range parts {
		if id, err := uuid.Parse(part); err == nil {
			parts[i] = id.String()
		}
	}
	return strings.Join(parts, "/")
}

// storedHeaderMap is what of h is stored with an answer (storedHeaders).
func storedHeaderMap(h http.Header) map[string]string {
	headers := map[string]string{}
	for _, name := range storedHeaders {
		if v := h.Get(name); v != "" {
			headers[name] = v
		}
	}
	return headers
}

// savedAnswer is the answer resp as this request stored it with its key,
// which expires at expires: what a replay of it reads from the database.
func (k *call) savedAnswer(resp Response, expires time.Time) *storedAnswer {
	return &storedAnswer{lockID: k.lockID, tenant: k.tenant, scope: k.scope, key: k.key,
		requestHash: k.hash[:], method: k.c.Request.Method, path: k.c.Request.URL.Path, status: resp.Status, header: replayHeader(storedHeaderMap(resp.Header)),
		body: resp.Body, requestID: k.requestID, expiresAt: expires}
}

// replay answers with a finished key's row, read from the database, and
// caches a live one's answer for the retries to come.
func (k *call) replay(stored *models.StoredKey) {
	var headers map[string]string
	if err := json.Unmarshal(stored.ResponseHeaders, &headers); err != nil {
		k.w.recent.add(k.lockID)
		k.fail(fmt.Errorf("stored headers: %w", err))
		return
	}
	ans := &storedAnswer{lockID: k.lockID, tenant: k.tenant, scope: k.scope, key: k.key,
		requestHash: stored.RequestHash, method: stored.RequestMethod, path: stored.RequestPath, status: stored.ResponseStatus, header: replayHeader(headers),
		body: stored.ResponseBody, requestID: stored.RequestID, expiresAt: stored.ExpiresAt}
	if stored.Found() && !stored.Expired {
		k.w.answers.put(ans)
	}
	k.replayAnswer(ans)
}

// replayAnswer answers with a finished key's answer, from the database or
// the cache alike: the stored answer when the request is the same, 422 when
// the key was used for another request.
func (k *call) replayAnswer(ans *storedAnswer) {
	k.w.recent.add(k.lockID)
	k.c.Header(HeaderKeyExpires, ans.expiresAt.UTC().Format(http.TimeFormat))
	if !k.sameRequest(ans.requestHash) {
		k.outcome = OutcomeMismatch
		k.problem(http.StatusUnprocessableEntity, problem.IdempotencyKeyReused,
			"Idempotency key has already been used with a different request "+k.differences(ans)+".")
		return
	}
	k.outcome = OutcomeReplayed
	h := k.c.Writer.Header()
	h.Add(HeaderReplayed, "true")
	h.Add(HeaderOriginalRequest, ans.requestID)
	k.write(ans.status, ans.header, ans.body)
}

func (k *call) write(status int, h http.Header, body []byte) {
	for name, vs := range h {
		for _, v := range vs {
			k.c.Writer.Header().Add(name, v)
		}
	}
	k.c.Writer.WriteHeader(status)
	_, _ = k.c.Writer.Write(body)
	k.c.Abort()
}

// inProgress answers 409: the first request with this key has not finished,
// so this one cannot be compared with it yet.
func (k *call) inProgress() {
	k.outcome = OutcomeInProgress
	k.c.Writer.Header().Del(HeaderPreferenceApplied) // if it waited, in vain
	k.c.Header("Retry-After", strconv.Itoa(k.w.cfg.RetryAfter))
	k.problem(http.StatusConflict, problem.IdempotencyKeyInProgress, "A request with this idempotency key is currently being processed.")
}

// reject answers a request refused before any work: nothing is stored.
func (k *call) reject(status int, code problem.Code, detail string) {
	k.outcome = OutcomeRejected
	k.problem(status, code, detail)
}

func (k *call) problem(status int, code problem.Code, detail string) {
	problem.Abort(k.c, status, code, detail)
}

// fail answers an error with a 5xx: nothing stored, so a retry executes
// afresh, except when the work's outcome is unknown, which the answer says
// (a retry with the same key then replays, or does the work). Every such
// answer carries Retry-After.
func (k *call) fail(err error) {
	k.outcome = OutcomeError
	k.c.Writer.Header().Del(HeaderPreferenceApplied)
	k.c.Header("Retry-After", strconv.Itoa(k.w.cfg.RetryAfter))
	switch {
	case errors.Is(err, models.ErrOutcomeUnknown):
		k.w.cfg.Log.WarnContext(k.c.Request.Context(), "idempotent request: outcome unknown",
			"scope", k.scope, "error", err, "request_id", k.requestID)
		detail := OutcomeUnknownDetail
		if k.key == "" {
			detail = OutcomeUnknownNoKeyDetail
		}
		k.problem(http.StatusServiceUnavailable, problem.ServiceUnavailable, detail)
	case models.IsUnavailable(err):
		k.w.cfg.Log.WarnContext(k.c.Request.Context(), "idempotent request: database unavailable",
			"scope", k.scope, "error", err, "request_id", k.requestID)
		k.problem(http.StatusServiceUnavailable, problem.ServiceUnavailable, "The database is unavailable; nothing was done. Retry the request.")
	case models.IsTimeout(err):
		k.problem(http.StatusServiceUnavailable, problem.RequestTimeout, "The request did not finish in time and was rolled back; retry it.")
	default:
		k.w.cfg.Log.ErrorContext(k.c.Request.Context(), "idempotent request failed",
			"scope", k.scope, "error", err, "request_id", k.requestID)
		k.problem(http.StatusInternalServerError, problem.InternalError, "An internal error occurred; nothing was done. Retry the request.")
	}
}
