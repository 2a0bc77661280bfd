package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/google/uuid"

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

// Response is a handler's answer. 2xx and 4xx answers to a keyed request are
// stored and replayed; only Content-Type and Location of Header are kept.
type Response struct {
	Status int
	Body   []byte
	Header http.Header
	// ResourceID, when set, is the id of what the request created, stored
	// on the key's row with the answer (Key.ResourceID) so that a key
	// leads to its resource. The wrapper does not read it; the Store
	// decides what it may hold, and a route whose resources the Store
	// cannot link leaves it empty.
	ResourceID string
	// Refused marks a 4xx that refuses the request as a check before the
	// handler would have (Refuse): like a 5xx, the work is rolled back and
	// the answer is not stored, so the key stays free.
	Refused bool
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

// answerCommitted answers with resp, whose work has committed (res), with
// its key's row when the request has a key.
func (k *call[T]) answerCommitted(resp Response, res Result) {
	if k.key != "" {
		k.outcome = OutcomeNew
		if res.Replaced {
			k.outcome = OutcomeExpiredReused
		}
		k.w.recent.add(k.lockID)
		k.w.answers.put(&answer{row: res.Key, header: replayHeader(storedHeaderMap(resp.Header))})
		if resp.Header == nil {
			resp.Header = http.Header{}
		}
		resp.Header.Set(HeaderKeyExpires, res.Key.ExpiresAt.UTC().Format(http.TimeFormat))
	}
	if resp.AfterCommit != nil {
		resp.AfterCommit()
	}
	k.write(resp.Status, resp.Header, resp.Body)
}

// answerUnstored answers with resp, an answer that is not stored (see
// storable), its work rolled back: a 5xx passed on (a retry executes
// afresh), a refusal, or 413 for an answer over the largest stored.
func (k *call[T]) answerUnstored(resp Response) {
	switch {
	case resp.Status >= 500:
		k.outcome = OutcomeError
		k.write(resp.Status, resp.Header, resp.Body)
	case resp.Status < 200:
		k.fail(fmt.Errorf("handler answered %d", resp.Status))
	case resp.Refused:
		k.outcome = OutcomeRejected
		k.write(resp.Status, resp.Header, resp.Body)
	default:
		k.reject(http.StatusRequestEntityTooLarge, problem.ResponseTooLarge, fmt.Sprintf(
			"The answer to this request would be %d bytes, over the limit of %d; nothing was done. Send a smaller request.",
			len(resp.Body), k.maxAnswer()))
	}
}

// replayCommitted answers with the key's row another request committed
// after this one looked (its own work was not written).
func (k *call[T]) replayCommitted(ctx context.Context) {
	res, err := k.w.store.Lookup(ctx, k.keyRef())
	switch {
	case err != nil:
		k.fail(err)
	case res.Key == nil:
		k.fail(errors.New("the key's row that took the key is gone"))
	default:
		k.replay(res.Key, res.Kind == KeyAnswered)
	}
}

// keyRow is the key's row that stores resp, as a commit writes it: nil
// without a key.
func (k *call[T]) keyRow(resp Response) *Key {
	if k.key == "" {
		return nil
	}
	hb, _ := json.Marshal(storedHeaderMap(resp.Header)) // map[string]string cannot fail
	return &Key{Tenant: k.tenant, Scope: k.scope, Key: k.key, LockID: k.lockID, RequestHash: k.hash[:],
		Method: k.c.Request.Method, Path: k.c.Request.URL.Path,
		RequestID: k.requestID, ClientIP: k.c.ClientIP(), UserAgent: k.c.Request.UserAgent(),
		Status: resp.Status, Headers: hb, Body: resp.Body, ResourceID: resp.ResourceID, TTL: k.w.cfg.TTL}
}

// sameRequest reports whether the stored fingerprint is this request's.
// Keys stored before fingerprints covered the route with normalised ids
// (at most IDEMPOTENCY_TTL ago) were fingerprinted with the path as sent:
// they match that too, so a retry across the upgrade still replays.
func (k *call[T]) sameRequest(stored []byte) bool {
	if bytes.Equal(stored, k.hash[:]) {
		return true
	}
	legacy := Fingerprint(k.c.Request.Method, k.c.Request.URL.Path, k.canonical)
	return bytes.Equal(stored, legacy[:])
}

// differences names what of the fingerprint differs between this request
// and the one its key was first used for (row): "method", "path", "body", or
// several, as in "path and body". The fingerprint is one hash, so each part
// is compared on its own: the method and the path (its ids made canonical,
// as a fingerprint's are) as stored, and the body by whether the stored hash
// is that of this body with the stored method and path.
func (k *call[T]) differences(row *Key) string {
	var parts []string
	if row.Method != k.c.Request.Method {
		parts = append(parts, "method")
	}
	path := canonicalPath(row.Path)
	if path != routePath(k.c) && row.Path != k.c.Request.URL.Path {
		parts = append(parts, "path")
	}
	same, legacy := Fingerprint(row.Method, path, k.canonical), Fingerprint(row.Method, row.Path, k.canonical)
	if !bytes.Equal(row.RequestHash, same[:]) && !bytes.Equal(row.RequestHash, legacy[:]) || len(parts) == 0 {
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

// replay answers with a finished key's row, read from the store, and caches
// a live one's answer for the retries to come.
func (k *call[T]) replay(row *Key, live bool) {
	var headers map[string]string
	if err := json.Unmarshal(row.Headers, &headers); err != nil {
		k.w.recent.add(k.lockID)
		k.fail(fmt.Errorf("stored headers: %w", err))
		return
	}
	row.Tenant, row.Scope, row.Key, row.LockID = k.tenant, k.scope, k.key, k.lockID
	ans := &answer{row: row, header: replayHeader(headers)}
	if live {
		k.w.answers.put(ans)
	}
	k.replayAnswer(ans)
}

// replayAnswer answers with a finished key's answer, from the store or the
// cache alike: the stored answer when the request is the same, 422 when
// the key was used for another request.
func (k *call[T]) replayAnswer(ans *answer) {
	k.w.recent.add(k.lockID)
	k.c.Header(HeaderKeyExpires, ans.row.ExpiresAt.UTC().Format(http.TimeFormat))
	if !k.sameRequest(ans.row.RequestHash) {
		k.outcome = OutcomeMismatch
		k.problem(http.StatusUnprocessableEntity, problem.IdempotencyKeyReused,
			"Idempotency key has already been used with a different request "+k.differences(ans.row)+".")
		return
	}
	k.outcome = OutcomeReplayed
	h := k.c.Writer.Header()
	h.Add(HeaderReplayed, "true")
	h.Add(HeaderOriginalRequest, ans.row.RequestID)
	k.write(ans.row.Status, ans.header, ans.row.Body)
}

func (k *call[T]) write(status int, h http.Header, body []byte) {
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
func (k *call[T]) inProgress() {
	k.outcome = OutcomeInProgress
	k.c.Writer.Header().Del(HeaderPreferenceApplied) // if it waited, in vain
	k.c.Header("Retry-After", strconv.Itoa(k.w.cfg.RetryAfter))
	k.problem(http.StatusConflict, problem.IdempotencyKeyInProgress, "A request with this idempotency key is currently being processed.")
}

// reject answers a request refused before any work: nothing is stored.
func (k *call[T]) reject(status int, code problem.Code, detail string) {
	k.outcome = OutcomeRejected
	k.problem(status, code, detail)
}

func (k *call[T]) problem(status int, code problem.Code, detail string) {
	problem.Abort(k.c, status, code, detail)
}

// fail answers an error with a 5xx: nothing stored, so a retry executes
// afresh, except when the work's outcome is unknown, which the answer says
// (a retry with the same key then replays, or does the work). Every such
// answer carries Retry-After.
func (k *call[T]) fail(err error) {
	k.outcome = OutcomeError
	k.c.Writer.Header().Del(HeaderPreferenceApplied)
	k.c.Header("Retry-After", strconv.Itoa(k.w.cfg.RetryAfter))
	switch k.w.store.Failure(err) {
	case OutcomeUnknown:
		k.w.cfg.Log.WarnContext(k.c.Request.Context(), "idempotent request: outcome unknown",
			"scope", k.scope, "error", err, "request_id", k.requestID)
		detail := OutcomeUnknownDetail
		if k.key == "" {
			detail = OutcomeUnknownNoKeyDetail
		}
		k.problem(http.StatusServiceUnavailable, problem.ServiceUnavailable, detail)
	case Unavailable:
		k.w.cfg.Log.WarnContext(k.c.Request.Context(), "idempotent request: database unavailable",
			"scope", k.scope, "error", err, "request_id", k.requestID)
		k.problem(http.StatusServiceUnavailable, problem.ServiceUnavailable, "The database is unavailable; nothing was done. Retry the request.")
	case Timeout:
		k.problem(http.StatusServiceUnavailable, problem.RequestTimeout, "The request did not finish in time and was rolled back; retry it.")
	default:
		k.w.cfg.Log.ErrorContext(k.c.Request.Context(), "idempotent request failed",
			"scope", k.scope, "error", err, "request_id", k.requestID)
		k.problem(http.StatusInternalServerError, problem.InternalError, "An internal error occurred; nothing was done. Retry the request.")
	}
}
