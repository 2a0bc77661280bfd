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
	"runtime/debug"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// Header names of the protocol.
const (
	HeaderKey             = "Idempotency-Key"
	HeaderReplayed        = "Idempotent-Replayed"
	HeaderOriginalRequest = "Original-Request-Id"
	HeaderRequestID       = "X-Request-Id"
)

// storedHeaders is the allowlist of response headers kept for replay. Never
// Set-Cookie or anything about authentication: a replay may reach another
// caller of the same organisation.
var storedHeaders = []string{"Content-Type", "Location"}

// Problem codes the wrapper answers with.
const (
	CodeKeyMissing    = "idempotency_key_missing"
	CodeKeyInvalid    = "idempotency_key_invalid"
	CodeKeyTooLong    = "idempotency_key_too_long"
	CodeKeyReused     = "idempotency_key_reused"
	CodeKeyInProgress = "idempotency_key_in_progress"
	CodeInvalidJSON   = "invalid_json"
	CodeBodyTooLarge  = "request_body_too_large"
	CodeInternal      = "internal_error"
	CodeTimeout       = "request_timeout"
)

// Outcomes counted by the idempotency_requests_total metric.
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

// Request is what a wrapped handler gets besides the transaction.
type Request struct {
	// Gin is the request's context, for path parameters and values set by
	// middleware. The handler must not write to it: it returns its answer.
	Gin *gin.Context
	// Body is the raw request body, known to be JSON (or empty).
	Body []byte
	// KeyID is the id the key row will have once the transaction commits
	// ("" without a key). A handler stores it on what it creates, to link it.
	KeyID string
	// RequestID is the request's X-Request-Id.
	RequestID string
}

// Response is a handler's answer. 2xx and 4xx answers to a keyed request are
// stored and replayed; only Content-Type and Location of Header are kept.
type Response struct {
	Status int
	Body   []byte
	Header http.Header
	// ValidationRunID, when set, is stored on the key row (validation_run_id).
	ValidationRunID string
	// AfterCommit, when set, is called once the answer has committed (never
	// for a replay, a rollback or a 5xx): work that must not happen inside
	// the transaction, such as waking a consumer of what it staged.
	AfterCommit func()
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
	d.Instance = req.Gin.Request.URL.Path
	d.RequestID = req.RequestID
	return Response{Status: d.Status, Body: d.Body(), Header: http.Header{"Content-Type": {problem.ContentType}}}
}

// Handler does a request's work on tx, the request's one transaction, and
// returns the answer. It may only touch PostgreSQL through tx: foreign work
// (a queue, an email) is staged in a table and done after commit. Whatever
// it wrote commits with its answer, 2xx or 4xx, so a handler that answers
// 4xx must do so before writing. An error, a 5xx or a panic rolls back
// everything: nothing happened, nothing is stored, the key is free.
type Handler func(tx *gorm.DB, req Request) (Response, error)

// Config configures a Wrapper; its zero value takes the defaults.
type Config struct {
	// TTL is how long a stored answer is replayed; 0 means 24h.
	TTL time.Duration
	// TxTimeout bounds the request transaction, which ignores client
	// hang-ups; 0 means 30s. Open the pool with the same value as
	// PostgreSQL's statement_timeout (models.DBOptions.StatementTimeout):
	// the server then cancels a statement that hangs, the connection stays
	// healthy and the rollback frees the key before the 503 is answered.
	// The transaction's own context deadline, TxTimeout plus txGrace, is the
	// backstop for a transaction of many slow statements.
	TxTimeout time.Duration
	// KeyRequired: a request without a key is 400 idempotency_key_missing.
	KeyRequired bool
	// RetryAfter is the Retry-After (seconds) of a 409; 0 means 1.
	RetryAfter int
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
	db   *gorm.DB
	keys *models.KeyStore
	cfg  Config
}

// New returns a Wrapper running transactions on db.
func New(db *gorm.DB, keys *models.KeyStore, cfg Config) *Wrapper {
	cfg.TTL = cmp.Or(cfg.TTL, 24*time.Hour)
	cfg.TxTimeout = cmp.Or(cfg.TxTimeout, 30*time.Second)
	cfg.RetryAfter = cmp.Or(cfg.RetryAfter, 1)
	cfg.Log = cmp.Or(cfg.Log, slog.New(slog.DiscardHandler))
	if cfg.Observe == nil {
		cfg.Observe = func(string, string) {}
	}
	if cfg.Tenant == nil {
		panic("idempotency: Config.Tenant is required")
	}
	return &Wrapper{db: db, keys: keys, cfg: cfg}
}

// call is one request going through the wrapper.
type call struct {
	w         *Wrapper
	c         *gin.Context
	scope     string
	tenant    string
	key       string
	body      []byte
	hash      [32]byte
	requestID string
	outcome   string
}

// Wrap returns a gin handler running h idempotently under scope (such as
// workflow_start): keys are unique per (tenant, scope, key).
func (w *Wrapper) Wrap(scope string, h Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		k := &call{w: w, c: c, scope: scope, tenant: w.cfg.Tenant(c), requestID: c.GetString(problem.RequestIDKey)}
		k.serve(h)
		w.cfg.Observe(scope, k.outcome)
	}
}

func (k *call) serve(h Handler) {
	raw, present := k.c.Request.Header[HeaderKey]
	switch {
	case present:
		key, err := ParseKey(raw[0])
		switch {
		case len(raw) > 1:
			k.reject(http.StatusBadRequest, CodeKeyInvalid, "Send exactly one Idempotency-Key header.")
			return
		case errors.Is(err, ErrKeyTooLong):
			k.reject(http.StatusBadRequest, CodeKeyTooLong, "Idempotency key exceeds maximum length of 255 characters.")
			return
		case err != nil:
			k.reject(http.StatusBadRequest, CodeKeyInvalid,
				"Idempotency key must be 1 to 255 printable ASCII characters, bare (abc) or as a quoted string (\"abc\").")
			return
		}
		k.key = key
	case k.w.cfg.KeyRequired:
		k.reject(http.StatusBadRequest, CodeKeyMissing, "This endpoint requires an Idempotency-Key header.")
		return
	}

	body, err := io.ReadAll(k.c.Request.Body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			k.reject(http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
				fmt.Sprintf("The request body exceeds the limit of %d bytes.", tooBig.Limit))
			return
		}
		k.reject(http.StatusBadRequest, CodeInvalidJSON, "The request body could not be read.")
		return
	}
	canonical, err := Canonicalize(body)
	if err != nil {
		k.reject(http.StatusBadRequest, CodeInvalidJSON, "The request body is not valid JSON: "+err.Error())
		return
	}
	k.body = body
	k.hash = Fingerprint(k.c.Request.Method, k.c.Request.URL.Path, canonical)

	// The work runs on a context the client cannot cancel, with its own
	// deadline: a client that hangs up still gets its answer stored.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(k.c.Request.Context()), k.w.cfg.TxTimeout+txGrace)
	defer cancel()

	if k.key == "" {
		k.outcome = OutcomeNoKey
		k.execute(ctx, h)
		return
	}

	// Replay fast path: one indexed read, no transaction. A key row only
	// exists once its request has finished, so any live row is an answer;
	// and with none, a request in flight (seen in pg_locks by the same
	// statement) is a 409 at once.
	stored, err := k.w.keys.Lookup(k.w.db.WithContext(ctx), k.tenant, k.scope, k.key)
	switch {
	case err != nil:
		k.fail(err)
		return
	case stored.Found() && !stored.Expired:
		k.replay(stored)
		return
	case stored.InFlight:
		k.inProgress()
		return
	}
	k.outcome = OutcomeNew
	if stored.Found() {
		k.outcome = OutcomeExpiredReused
	}
	k.execute(ctx, h)
}

// execute runs the handler in the request's one transaction. With a key it
// first takes the key's advisory lock (not granted: 409) and ends by saving
// the key row with the answer, in the round trip of the COMMIT.
func (k *call) execute(ctx context.Context, h Handler) {
	req := Request{Gin: k.c, Body: k.body, RequestID: k.requestID}
	var lockID *int64
	if k.key != "" {
		req.KeyID = uuid.NewString()
		id := models.LockID(k.tenant, k.scope, k.key)
		lockID = &id
	}
	tx, locked, err := models.BeginRequest(ctx, k.w.db, k.w.cfg.TxTimeout, lockID)
	switch {
	case err != nil:
		k.fail(err)
		return
	case !locked:
		k.inProgress()
		return
	}
	defer tx.Rollback() // after a commit, nothing to do

	resp, err := k.handle(tx.DB(), h, req)
	switch {
	case err != nil:
		k.fail(err)
		return
	case resp.Status >= 500:
		// Rolled back, passed on, not stored: a retry executes afresh.
		tx.Rollback()
		k.outcome = OutcomeError
		k.write(resp.Status, resp.Header, resp.Body)
		return
	case resp.Status < 200:
		k.fail(fmt.Errorf("handler answered %d", resp.Status))
		return
	}
	if k.key == "" {
		err = tx.Commit(ctx)
	} else {
		err = tx.CommitWithKey(ctx, k.keyRow(req.KeyID, resp), k.w.cfg.TTL)
	}
	if errors.Is(err, models.ErrConflict) {
		// A request holding the lock before us committed this key after
		// our fast-path read: our work is rolled back; answer with theirs.
		stored, err := k.w.keys.Lookup(k.w.db.WithContext(ctx), k.tenant, k.scope, k.key)
		if err != nil {
			k.fail(err)
			return
		}
		k.replay(stored)
		return
	}
	if err != nil {
		k.fail(err)
		return
	}
	if resp.AfterCommit != nil {
		resp.AfterCommit()
	}
	k.write(resp.Status, resp.Header, resp.Body)
}

// handle runs the handler on tx; a panic is an error (logged with its stack).
func (k *call) handle(tx *gorm.DB, h Handler, req Request) (resp Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			k.w.cfg.Log.ErrorContext(tx.Statement.Context, "panic in idempotent handler",
				"scope", k.scope, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return h(tx, req)
}

// txGrace lets the transaction's statement_timeout (equal to TxTimeout) fire
// before the context deadline does: a statement cancelled by the server
// leaves a connection that can roll back at once, while one cancelled by the
// client is abandoned and its backend holds the key's lock until it notices.
const txGrace = 2 * time.Second

func (k *call) keyRow(id string, resp Response) *models.IdempotencyKey {
	headers := map[string]string{}
	for _, name := range storedHeaders {
		if v := resp.Header.Get(name); v != "" {
			headers[name] = v
		}
	}
	hb, _ := json.Marshal(headers) // map[string]string cannot fail
	row := &models.IdempotencyKey{
		ID: id, OrgID: k.tenant, Endpoint: k.scope, Key: k.key, RequestHash: k.hash[:],
		RequestMethod: k.c.Request.Method, RequestPath: k.c.Request.URL.Path,
		ResponseStatus: resp.Status, ResponseBody: resp.Body, ResponseHeaders: hb,
		RequestID: k.requestID, ClientIP: k.c.ClientIP(), UserAgent: k.c.Request.UserAgent(),
	}
	if row.RequestID == "" {
		row.RequestID = id
	}
	if resp.ValidationRunID != "" {
		row.ValidationRunID = &resp.ValidationRunID
	}
	return row
}

// replay answers with a finished key: the stored answer when the request is
// the same, 422 when the key was used for another request.
func (k *call) replay(stored *models.StoredKey) {
	if string(stored.RequestHash) != string(k.hash[:]) {
		k.outcome = OutcomeMismatch
		k.problem(http.StatusUnprocessableEntity, CodeKeyReused,
			"Idempotency key has already been used with a different request body.")
		return
	}
	k.outcome = OutcomeReplayed
	var headers map[string]string
	if err := json.Unmarshal(stored.ResponseHeaders, &headers); err != nil {
		k.fail(fmt.Errorf("stored headers: %w", err))
		return
	}
	h := http.Header{}
	for name, v := range headers {
		h.Set(name, v)
	}
	h.Set(HeaderReplayed, "true")
	h.Set(HeaderOriginalRequest, stored.RequestID)
	k.write(stored.ResponseStatus, h, stored.ResponseBody)
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
	k.c.Header("Retry-After", strconv.Itoa(k.w.cfg.RetryAfter))
	k.problem(http.StatusConflict, CodeKeyInProgress, "A request with this idempotency key is currently being processed.")
}

// reject answers a request refused before any work: nothing is stored.
func (k *call) reject(status int, code, detail string) {
	k.outcome = OutcomeRejected
	k.problem(status, code, detail)
}

func (k *call) problem(status int, code, detail string) {
	problem.Abort(k.c, status, code, detail)
}

// fail answers an error that rolled everything back: 5xx, nothing stored,
// so a retry executes afresh.
func (k *call) fail(err error) {
	k.outcome = OutcomeError
	if models.IsTimeout(err) {
		k.c.Header("Retry-After", strconv.Itoa(k.w.cfg.RetryAfter))
		k.problem(http.StatusServiceUnavailable, CodeTimeout, "The request did not finish in time and was rolled back; retry it.")
		return
	}
	k.w.cfg.Log.ErrorContext(k.c.Request.Context(), "idempotent request failed",
		"scope", k.scope, "error", err, "request_id", k.requestID)
	k.problem(http.StatusInternalServerError, CodeInternal, "An internal error occurred; nothing was done. Retry the request.")
}
