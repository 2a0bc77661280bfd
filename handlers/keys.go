package handlers

import (
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

type keyHandlers struct {
	keys *models.KeyStore
}

// Key states.
const (
	KeyFinished   = "finished"
	KeyExpired    = "expired"
	KeyInProgress = "in_progress"
)

// IdempotencyKey is one of the organisation's idempotency keys: did a
// request with it go through, when, and what did it create?
type IdempotencyKey struct {
	// Scope is the endpoint the key belongs to: workflow_start, workflow_create, webhook_endpoint_create, webhook_secret_rotate, webhook_delivery_redeliver or webhook_test_event.
	Scope string `json:"scope" validate:"required" enums:"workflow_start,workflow_create,webhook_endpoint_create,webhook_secret_rotate,webhook_delivery_redeliver,webhook_test_event" example:"workflow_start"`
	Key   string `json:"key" validate:"required" example:"order-1042"`
	// State is finished (a retry gets the stored answer), expired (a request
	// with this key now starts new work) or in_progress (its first request is
	// being processed right now: nothing else is known yet; look again shortly).
	State string `json:"state" validate:"required" example:"finished" enums:"finished,expired,in_progress"`
	// CreatedAt is when the first request finished; ExpiresAt when the key expires.
	CreatedAt *time.Time `json:"created_at,omitempty" format:"date-time" example:"2026-11-22T10:00:00Z"`
	ExpiresAt *time.Time `json:"expires_at,omitempty" format:"date-time" example:"2026-11-23T10:00:00Z"`
	// RequestID is the X-Request-Id of the request that did the work.
	RequestID string `json:"request_id,omitempty" example:"69c2d1f4ac32164190e26ac5"`
	// RequestMethod and RequestPath are what it was sent to.
	RequestMethod string `json:"request_method,omitempty" example:"POST"`
	RequestPath   string `json:"request_path,omitempty" example:"/api/workflows/0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a/start"`
	// ResponseStatus is the status it was answered, and every retry is.
	ResponseStatus int `json:"response_status,omitempty" example:"201"`
	// ValidationRunID is the run it created (absent for other answers, and
	// once the run is gone).
	ValidationRunID *string `json:"validation_run_id,omitempty" format:"uuid" example:"5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a"`
}

// get godoc
//
//	@Summary		Look up an idempotency key
//	@ID			getIdempotencyKey
//	@Description	Answers a support ticket's first question, "did my request go through?", for one of your organisation's keys: its state (`finished`, `expired`, or `in_progress` while its first request is being processed), when it was used and expires, the first request's id, the status it was answered, and the run it created. Reading a key changes nothing.
//	@Description
//	@Description	Percent-encode the key in the path (a `/` as `%2F`). Another organisation's key, a key never used, and one already deleted by the cleanup are 404.
//	@Tags			idempotency
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			scope	path		string				true	"The endpoint scope"	Enums(workflow_start, workflow_create, webhook_endpoint_create, webhook_secret_rotate, webhook_delivery_redeliver, webhook_test_event)
//	@Param			key		path		string				true	"The Idempotency-Key, percent-encoded (such as order-1042): 1 to 255 printable ASCII characters, in the bare form (no quotes, no space first or last)"	minlength(1)	maxlength(255)	extensions(x-pattern=^[!#-~]$|^[!#-~][ -~]*[!-~]$)
//	@Success		200		{object}	IdempotencyKey		"The key."
//	@Failure		400		{object}	ProblemBadRequest	"`validation_error`: the key is not 1 to 255 printable ASCII characters."
//	@Failure		401		{object}	ProblemUnauthorized	"common:unauthorized"
//	@Failure		404		{object}	ProblemNotFound	"`not_found`: no such key in your organisation and scope, or no such scope."
//	@Failure		500		{object}	ProblemInternal		"common:internal"
//	@Failure		503		{object}	ProblemUnavailable	"common:unavailable"
//	@Header			200		{integer}	Retry-After			"With state in_progress: seconds after which to look again."
//	@Router			/api/idempotency-keys/{scope}/{key} [get]
func (h *keyHandlers) get(c *gin.Context) {
	scope, raw := c.Param("scope"), c.Param("key")
	key, err := idempotency.ParseKey(raw)
	if err != nil || key != raw { // the bare form only: a path has no quoting
		problem.Write(c, badRequest("The key must be 1 to 255 printable ASCII characters, percent-encoded in the path.",
			problem.FieldError{Field: "key", Message: "1 to 255 printable ASCII characters"}))
		return
	}
	if !slices.Contains([]string{ScopeWorkflowStart, ScopeWorkflowCreate, ScopeWebhookCreate, ScopeWebhookRotate, ScopeWebhookResend, ScopeWebhookTest}, scope) {
		problem.Write(c, notFound("Idempotency key"))
		return
	}
	orgID := principalOf(c).OrgID
	res, err := h.keys.Lookup(c.Request.Context(), &idempotency.Key{Tenant: orgID, Scope: scope, Key: key,
		LockID: idempotency.LockID(orgID, scope, key)})
	switch {
	case errors.Is(err, models.ErrNotFound):
		problem.Write(c, notFound("Idempotency key"))
		return
	case err != nil:
		internalError(c, err)
		return
	}
	out := IdempotencyKey{Scope: scope, Key: key}
	k := res.Key
	switch {
	case res.Kind == idempotency.KeyInFlight:
		out.State = KeyInProgress
		c.Header("Retry-After", "1")
		c.PureJSON(http.StatusOK, out)
		return
	case k == nil:
		problem.Write(c, notFound("Idempotency key"))
		return
	case res.Kind == idempotency.KeyAnswered:
		out.State = KeyFinished
	default: // a row past its expiry
		out.State = KeyExpired
	}
	created, expires := k.CreatedAt.UTC(), k.ExpiresAt.UTC()
	out.CreatedAt, out.ExpiresAt = &created, &expires
	out.RequestID, out.RequestMethod, out.RequestPath = k.RequestID, k.Method, k.Path
	out.ResponseStatus = k.Status
	if k.ResourceID != "" {
		out.ValidationRunID = &k.ResourceID
	}
	c.PureJSON(http.StatusOK, out)
}
