package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
	"github.com/valruns/valruns/webhooks"
)

// maxWebhookDescription bounds an endpoint's description, in characters.
const maxWebhookDescription = 500

type webhookHandlers struct {
	endpoints *models.WebhookStore
	// allowPrivate: WEBHOOK_ALLOW_PRIVATE_TARGETS.
	allowPrivate bool
}

// CreateWebhookEndpointRequest is the body of POST /api/webhook-endpoints/.
// A member it does not name is refused (400 validation_error).
type CreateWebhookEndpointRequest struct {
	// URL receives the events: https, or http to a public address; at most 2048 bytes. Loopback, private, link-local and metadata addresses are refused unless the server sets WEBHOOK_ALLOW_PRIVATE_TARGETS=true.
	URL string `json:"url" validate:"required" minLength:"1" maxLength:"2048" format:"uri" extensions:"x-pattern=^[hH][tT][tT][pP][sS]?://[^/?#@]+" example:"https://example.com/valruns-hooks"`
	// Description is a note for people, at most 500 characters.
	Description string `json:"description,omitempty" maxLength:"500" example:"invoices service"`
	// Events are the event types delivered to the endpoint, at least one; absent means all of them (today: validation_run.finished).
	Events []string `json:"events,omitempty" extensions:"x-min-items=1" enums:"validation_run.finished"`
}

// WebhookEndpoint is a webhook endpoint as the API shows it (its secret only
// when it is made: WebhookEndpointWithSecret).
type WebhookEndpoint struct {
	ID          string   `json:"id" validate:"required" format:"uuid" example:"7c1e2d3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f"`
	URL         string   `json:"url" validate:"required" example:"https://example.com/valruns-hooks"`
	Description string   `json:"description" validate:"required" example:"invoices service"`
	Events      []string `json:"events" validate:"required" enums:"validation_run.finished"`
	// PreviousSecretExpiresAt: after a rotation, until when the previous secret still signs beside the new one; absent otherwise.
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at,omitempty" format:"date-time" example:"2026-11-23T10:00:00Z"`
	CreatedAt               time.Time  `json:"created_at" validate:"required" format:"date-time" example:"2026-11-22T10:00:00Z"`
}

// WebhookEndpointWithSecret is an endpoint with its signing secret: the
// answer of its creation and of a rotation, the only times the secret is shown.
type WebhookEndpointWithSecret struct {
	WebhookEndpoint
	// Secret signs the deliveries (Standard Webhooks): "whsec_" + base64 of 32 random bytes. Keep it: it is not shown again.
	Secret string `json:"secret" validate:"required" example:"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYq="`
}

// WebhookEndpointList is one page of webhook endpoints, newest first.
type WebhookEndpointList struct {
	Data []WebhookEndpoint `json:"data" validate:"required"`
	// NextCursor fetches the next page (?cursor=); absent on the last page.
	NextCursor string `json:"next_cursor,omitempty" example:"MjAyNi0xMS0yMlQwMjo0MDo"`
}

func webhookEndpointOf(e *models.WebhookEndpoint) WebhookEndpoint {
	out := WebhookEndpoint{ID: e.ID, URL: e.URL, Description: e.Description, CreatedAt: e.CreatedAt.UTC(), Events: []string{}}
	_ = json.Unmarshal(e.Events, &out.Events) // written by create, always an array of strings
	if e.PreviousSecretExpiresAt != nil && time.Now().Before(*e.PreviousSecretExpiresAt) {
		t := e.PreviousSecretExpiresAt.UTC()
		out.PreviousSecretExpiresAt = &t
	}
	return out
}

// create godoc
//
//	@Summary		Create a webhook endpoint
//	@ID			createWebhookEndpoint
//	@Description	Registers a URL that receives the organisation's events (`validation_run.finished`: a run reached `passed`, `failed` or `error`), signed per the Standard Webhooks specification. The answer carries the endpoint's signing `secret`, **shown only here** (and in the replays of this request with its Idempotency-Key): keep it to verify deliveries.
//	@Description
//	@Description	The URL must be `https`, or `http` to a public address; loopback, private, link-local and metadata addresses are refused (400) unless the server sets `WEBHOOK_ALLOW_PRIVATE_TARGETS=true`. A host name is checked again each time a delivery resolves it.
//	@Description
//	@Description	Send a new `Idempotency-Key` per endpoint and the same on every retry: retries then create one endpoint and get the first answer back (replays, 422, 409 and `Prefer: wait` as for workflows).
//	@Tags			webhooks
//	@Accept			json
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			Idempotency-Key	header		string							false	"**A new value per endpoint you mean to create** (a UUID), the same on every retry of it; left empty, Try it out sends a new UUID.<br>1 to 255 printable ASCII characters. Optional unless the server sets `IDEMPOTENCY_KEY_REQUIRED=true`.<br>Same key and request: the first answer again. Same key, other body: 422. First still running: 409."	minlength(1)	maxlength(255)	extensions(x-pattern=^[!#-~][ -~]*$|^"[ !#-\x5b\x5d-~]+"$)
//	@Param			Prefer			header		string							false	"`wait=N` (RFC 7240): if a request with this Idempotency-Key is still being processed, wait up to N seconds (at most `IDEMPOTENCY_MAX_WAIT`) for its answer instead of a 409. The answer then carries `Preference-Applied: wait=N`. Other preferences are ignored."
//	@Param			body			body		CreateWebhookEndpointRequest	true	"The endpoint"
//	@Success		201				{object}	WebhookEndpointWithSecret		"Created, with its secret; with `Idempotent-Replayed: true`, the replay of the first answer."
//	@Failure		400				{object}	ProblemBadRequest				"`validation_error` (url missing, not http or https, too long, with user information, a port out of 1-65535, an IPv4 address not in dotted-decimal form, or a private target; description over 500 characters; an empty events list or an unknown event type; a field the route does not take; a string or member name that holds the NUL character \u0000), `invalid_json`, `invalid_number` (a number of more than 256 digits in decimal); or the Idempotency-Key is malformed: `idempotency_key_invalid`, `idempotency_key_too_long`, `idempotency_key_missing` (IDEMPOTENCY_KEY_REQUIRED=true). `validation_error` with a key is stored and replayed."
//	@Failure		401				{object}	ProblemUnauthorized				"common:unauthorized"
//	@Failure		408				{object}	ProblemBodyTimeout				"`request_body_timeout`: the body arrived slower than the server's read timeout; nothing was done or stored. Send the request again."
//	@Failure		409				{object}	ProblemInProgress				"`idempotency_key_in_progress`: a request with this key is still being processed; retry after `Retry-After` seconds, or send `Prefer: wait=N`."
//	@Failure		413				{object}	ProblemTooLarge					"`request_body_too_large`: the body exceeds MAX_BODY_BYTES (nothing is stored)."
//	@Failure		415				{object}	ProblemUnsupportedEncoding		"`unsupported_content_encoding`: a Content-Encoding other than gzip; nothing is stored."
//	@Failure		422				{object}	ProblemKeyReused				"`idempotency_key_reused`: the key was used for a different request (another body) within 24 h; use a new key."
//	@Failure		500				{object}	ProblemInternal					"`internal_error`: nothing was done and nothing stored; retry, with the same key."
//	@Failure		503				{object}	ProblemUnavailable				"common:unavailable_keyed"
//	@Header			201				{string}	Location						"The endpoint: /api/webhook-endpoints/{id}/"
//	@Header			201,400			{string}	Idempotent-Replayed				"`true` when this answer is the replay of an earlier request with the same Idempotency-Key (absent otherwise)."
//	@Header			201,400			{string}	Original-Request-Id				"On a replay: the X-Request-Id of the request that did the work."
//	@Header			201,400,422		{string}	Idempotency-Key-Expires			"With an Idempotency-Key, on an answer stored under it (and its replays) and on a 422: when the key expires, as an HTTP-date."
//	@Header			201,422			{string}	Preference-Applied				"`wait=N` when the request waited (`Prefer: wait=N`) for the first request with its key."
//	@Header			409,500		{integer}	Retry-After						"Seconds to wait before retrying."
//	@Header			415				{string}	Accept-Encoding					"`gzip`: the one Content-Encoding accepted."
//	@Router			/api/webhook-endpoints/ [post]
func (h *webhookHandlers) create(tx *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
	var in CreateWebhookEndpointRequest
	if d := decodeStrict(req.Body, &in); d != nil {
		return idempotency.Problem(req, *d), nil
	}
	if err := webhooks.CheckURL(in.URL, h.allowPrivate); err != nil {
		return idempotency.Problem(req, badRequest("url: "+err.Error()+".",
			problem.FieldError{Field: "url", Message: err.Error()})), nil
	}
	if utf8.RuneCountInString(in.Description) > maxWebhookDescription || !utf8.ValidString(in.Description) {
		return idempotency.Problem(req, badRequest("description: at most 500 characters.",
			problem.FieldError{Field: "description", Message: "at most 500 characters"})), nil
	}
	events := in.Events
	if events == nil {
		events = slices.Clone(webhooks.EventTypes)
	}
	if len(events) == 0 {
		return idempotency.Problem(req, badRequest("events: at least one event type, or leave it out for all of them.",
			problem.FieldError{Field: "events", Message: "at least one event type"})), nil
	}
	for i, ev := range events {
		if !slices.Contains(webhooks.EventTypes, ev) {
			msg := "unknown event type; one of " + strings.Join(webhooks.EventTypes, ", ")
			return idempotency.Problem(req, badRequest("events: "+msg+".",
				problem.FieldError{Field: "events[" + strconv.Itoa(i) + "]", Message: msg})), nil
		}
	}
	slices.Sort(events)
	events = slices.Compact(events)
	eb, err := json.Marshal(events)
	if err != nil {
		return idempotency.Response{}, err
	}
	secret, err := models.NewWebhookSecret()
	if err != nil {
		return idempotency.Response{}, err
	}
	e := &models.WebhookEndpoint{OrgID: principalOf(req.Gin).OrgID, URL: in.URL, Description: in.Description, Events: eb, Secret: secret}
	if err := h.endpoints.Create(tx.DB(), e); err != nil {
		return idempotency.Response{}, err
	}
	resp, err := idempotency.JSON(http.StatusCreated, WebhookEndpointWithSecret{WebhookEndpoint: webhookEndpointOf(e), Secret: secret})
	if err != nil {
		return idempotency.Response{}, err
	}
	resp.Header.Set("Location", "/api/webhook-endpoints/"+e.ID+"/")
	return resp, nil
}

// list godoc
//
//	@Summary		List webhook endpoints
//	@ID			listWebhookEndpoints
//	@Description	The organisation's webhook endpoints, newest first, a page at a time: pass `next_cursor` back as `?cursor=` for the next page. Secrets are not shown.
//	@Tags			webhooks
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			limit	query		int					false	"Page size, 1-100 (default 20)"	minimum(1)	maximum(100)
//	@Param			cursor	query		string				false	"next_cursor of the previous page"
//	@Success		200		{object}	WebhookEndpointList	"One page of endpoints."
//	@Failure		400		{object}	ProblemBadRequest	"`validation_error` (limit is not 1 to 100, a query string that is not valid percent-encoding) or `invalid_cursor` (not a cursor this API returned)."
//	@Failure		401		{object}	ProblemUnauthorized	"common:unauthorized"
//	@Failure		500		{object}	ProblemInternal		"common:internal"
//	@Failure		503		{object}	ProblemUnavailable	"common:unavailable"
//	@Router			/api/webhook-endpoints/ [get]
func (h *webhookHandlers) list(c *gin.Context) {
	page, ok := pageOf(c)
	if !ok {
		return
	}
	es, next, err := h.endpoints.List(c.Request.Context(), principalOf(c).OrgID, page)
	if err != nil {
		internalError(c, err)
		return
	}
	out := WebhookEndpointList{Data: make([]WebhookEndpoint, 0, len(es)), NextCursor: cursorOf(next)}
	for i := range es {
		out.Data = append(out.Data, webhookEndpointOf(&es[i]))
	}
	c.PureJSON(http.StatusOK, out)
}

// get godoc
//
//	@Summary		Read a webhook endpoint
//	@ID			getWebhookEndpoint
//	@Description	One webhook endpoint of the organisation, without its secret. Another organisation's endpoint, or an id that is not a UUID, is a 404.
//	@Tags			webhooks
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			id	path		string					true	"Webhook endpoint id (UUID)"	format(uuid)
//	@Success		200	{object}	WebhookEndpoint			"The endpoint."
//	@Failure		401	{object}	ProblemUnauthorized		"common:unauthorized"
//	@Failure		404	{object}	ProblemNotFound	"`not_found`: no such endpoint in your organisation (or the id is not a UUID)."
//	@Failure		500	{object}	ProblemInternal			"common:internal"
//	@Failure		503	{object}	ProblemUnavailable		"common:unavailable"
//	@Router			/api/webhook-endpoints/{id}/ [get]
func (h *webhookHandlers) get(c *gin.Context) {
	id, ok := canonicalID(c.Param("id"))
	if !ok {
		problem.Write(c, notFound("Webhook endpoint"))
		return
	}
	e, err := h.endpoints.Get(c.Request.Context(), principalOf(c).OrgID, id)
	answerEndpoint(c, err, func() { c.PureJSON(http.StatusOK, webhookEndpointOf(e)) })
}

// answerEndpoint answers the outcome of a store call on one endpoint: 404
// when the organisation has no such endpoint, 500 (or 503) when the call
// failed, and ok's answer otherwise.
func answerEndpoint(c *gin.Context, err error, ok func()) {
	switch {
	case errors.Is(err, models.ErrNotFound):
		problem.Write(c, notFound("Webhook endpoint"))
	case err != nil:
		internalError(c, err)
	default:
		ok()
	}
}

// delete godoc
//
//	@Summary		Delete a webhook endpoint
//	@ID			deleteWebhookEndpoint
//	@Description	Deletes one webhook endpoint of the organisation: it receives no more events. Deleting it again, another organisation's endpoint, or an id that is not a UUID, is a 404.
//	@Tags			webhooks
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			id	path		string					true	"Webhook endpoint id (UUID)"	format(uuid)
//	@Success		204	"Deleted."
//	@Failure		401	{object}	ProblemUnauthorized		"common:unauthorized"
//	@Failure		404	{object}	ProblemNotFound	"`not_found`: no such endpoint in your organisation (or the id is not a UUID)."
//	@Failure		500	{object}	ProblemInternal			"`internal_error`: the deletion failed; retry."
//	@Failure		503	{object}	ProblemUnavailable		"common:unavailable"
//	@Header			500	{integer}	Retry-After	"Seconds to wait before retrying."
//	@Router			/api/webhook-endpoints/{id}/ [delete]
func (h *webhookHandlers) delete(c *gin.Context) {
	id, ok := canonicalID(c.Param("id"))
	if !ok {
		problem.Write(c, notFound("Webhook endpoint"))
		return
	}
	err := h.endpoints.Delete(c.Request.Context(), principalOf(c).OrgID, id)
	answerEndpoint(c, err, func() { c.Status(http.StatusNoContent) })
}

// rotate godoc
//
//	@Summary		Rotate a webhook endpoint's secret
//	@ID			rotateWebhookSecret
//	@Description	Gives the endpoint a new signing secret, answered here once. The secret it replaces keeps signing beside the new one for 24 h (`previous_secret_expires_at`): meanwhile `webhook-signature` carries both signatures, space-separated, so a receiver may switch to the new secret at any time within the day. Rotating again ends the old overlap at once, so **send an `Idempotency-Key`**: a retry of a rotation whose answer was lost then gets that answer (the same new secret) instead of rotating again, which would drop the secret your receivers still use. No body.
//	@Tags			webhooks
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			id				path		string						true	"Webhook endpoint id (UUID)"	format(uuid)
//	@Param			Idempotency-Key	header		string						false	"**A new value per rotation you mean to make** (a UUID), the same on every retry of it; left empty, Try it out sends a new UUID.<br>1 to 255 printable ASCII characters. Optional unless the server sets `IDEMPOTENCY_KEY_REQUIRED=true`.<br>Same key and request: the first answer again. Same key, another endpoint: 422. First still running: 409."	minlength(1)	maxlength(255)	extensions(x-pattern=^[!#-~][ -~]*$|^"[ !#-\x5b\x5d-~]+"$)
//	@Param			Prefer			header		string						false	"`wait=N` (RFC 7240): if a request with this Idempotency-Key is still being processed, wait up to N seconds (at most `IDEMPOTENCY_MAX_WAIT`) for its answer instead of a 409. The answer then carries `Preference-Applied: wait=N`. Other preferences are ignored."
//	@Success		200				{object}	WebhookEndpointWithSecret	"The endpoint with its new secret; with `Idempotent-Replayed: true`, the replay of the first answer."
//	@Failure		400				{object}	ProblemBadRequest			"The Idempotency-Key is malformed: `idempotency_key_invalid`, `idempotency_key_too_long`, `idempotency_key_missing` (IDEMPOTENCY_KEY_REQUIRED=true)."
//	@Failure		401				{object}	ProblemUnauthorized			"common:unauthorized"
//	@Failure		404				{object}	ProblemNotFound		"`not_found`: no such endpoint in your organisation (or the id is not a UUID); with a key, stored and replayed."
//	@Failure		409				{object}	ProblemInProgress			"`idempotency_key_in_progress`: a request with this key is still being processed; retry after `Retry-After` seconds, or send `Prefer: wait=N`."
//	@Failure		422				{object}	ProblemKeyReused			"`idempotency_key_reused`: the key was used for a different request (another endpoint) within 24 h; use a new key."
//	@Failure		500				{object}	ProblemInternal				"`internal_error`: the rotation failed, changed nothing and stored nothing; retry, with the same key."
//	@Failure		503				{object}	ProblemUnavailable			"common:unavailable_keyed"
//	@Header			200,404			{string}	Idempotent-Replayed			"`true` when this answer is the replay of an earlier request with the same Idempotency-Key (absent otherwise)."
//	@Header			200,404			{string}	Original-Request-Id			"On a replay: the X-Request-Id of the request that did the work."
//	@Header			200,404,422		{string}	Idempotency-Key-Expires		"With an Idempotency-Key, on an answer stored under it (and its replays) and on a 422: when the key expires (RFC 9110 HTTP-date)."
//	@Header			200,404,422		{string}	Preference-Applied			"`wait=N` when the request waited (`Prefer: wait=N`) for the first request with its key."
//	@Header			409,500		{integer}	Retry-After					"Seconds to wait before retrying."
//	@Router			/api/webhook-endpoints/{id}/rotate-secret/ [post]
func (h *webhookHandlers) rotate(tx *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
	id, ok := canonicalID(req.Gin.Param("id"))
	if !ok {
		return idempotency.Problem(req, notFound("Webhook endpoint")), nil
	}
	secret, err := models.NewWebhookSecret()
	if err != nil {
		return idempotency.Response{}, err
	}
	e, err := h.endpoints.RotateSecret(tx.DB(), principalOf(req.Gin).OrgID, id, secret)
	if errors.Is(err, models.ErrNotFound) {
		return idempotency.Problem(req, notFound("Webhook endpoint")), nil
	}
	if err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.JSON(http.StatusOK, WebhookEndpointWithSecret{WebhookEndpoint: webhookEndpointOf(e), Secret: secret})
}

// WebhookDelivery is the delivery of one event to one endpoint.
type WebhookDelivery struct {
	ID string `json:"id" validate:"required" format:"uuid" example:"2d3e4f5a-6b7c-4d8e-9f0a-1b2c3d4e5f6a"`
	// EventID is the event's id, sent as webhook-id on every attempt: receivers drop duplicates by it.
	EventID string `json:"event_id" validate:"required" example:"evt_5b0f6b8e3f7c4d2a9a573b2f4c1d0e9a"`
	// EventType is validation_run.finished, or webhook.test for a test event (POST /api/webhook-endpoints/{id}/test/).
	EventType string `json:"event_type" validate:"required" enums:"validation_run.finished,webhook.test" example:"validation_run.finished"`
	// RunID is the run the event is about; absent for a test event.
	RunID *string `json:"run_id,omitempty" format:"uuid" example:"5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a"`
	// Status: pending (not yet delivered; attempts go on), delivered (a 2xx answer), failed (given up).
	Status   string `json:"status" validate:"required" enums:"pending,delivered,failed" example:"pending"`
	Attempts int    `json:"attempts" validate:"required" minimum:"0" example:"0"`
	// LastStatusCode is the HTTP status of the last attempt's answer; absent when it had none.
	LastStatusCode *int `json:"last_status_code,omitempty" example:"503"`
	// LastError says why the last attempt failed without an answer, coarsely and never with an address: the target's address is not allowed, the host name could not be resolved, connection refused, timed out...; or "answered N" when the answer was not a 2xx.
	LastError *string `json:"last_error,omitempty" example:"connection refused"`
	// NextAttemptAt is when the next attempt is due, while pending.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty" format:"date-time" example:"2026-11-22T10:00:00Z"`
	CreatedAt     time.Time  `json:"created_at" validate:"required" format:"date-time" example:"2026-11-22T10:00:00Z"`
	// DeliveredAt is when a 2xx answer came.
	DeliveredAt *time.Time `json:"delivered_at,omitempty" format:"date-time" example:"2026-11-22T10:00:01Z"`
}

// WebhookDeliveryList is one page of an endpoint's deliveries, newest first.
type WebhookDeliveryList struct {
	Data []WebhookDelivery `json:"data" validate:"required"`
	// NextCursor fetches the next page (?cursor=); absent on the last page.
	NextCursor string `json:"next_cursor,omitempty" example:"MjAyNi0xMS0yMlQwMjo0MDo"`
}

// deliveries godoc
//
//	@Summary		List a webhook endpoint's deliveries
//	@ID			listWebhookDeliveries
//	@Description	Each event recorded for the endpoint, newest first, with its delivery's `status` (`pending`, `delivered`, `failed`), attempts, the last answer's status code or error, and when the next attempt is due. An event is recorded in the same transaction as the run's final state; a test event (`webhook.test`, no `run_id`) when one is sent.
//	@Tags			webhooks
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			id		path		string					true	"Webhook endpoint id (UUID)"	format(uuid)
//	@Param			limit	query		int						false	"Page size, 1-100 (default 20)"	minimum(1)	maximum(100)
//	@Param			cursor	query		string					false	"next_cursor of the previous page"
//	@Success		200		{object}	WebhookDeliveryList		"One page of deliveries."
//	@Failure		400		{object}	ProblemBadRequest		"`validation_error` (limit is not 1 to 100, a query string that is not valid percent-encoding) or `invalid_cursor` (not a cursor this API returned)."
//	@Failure		401		{object}	ProblemUnauthorized		"common:unauthorized"
//	@Failure		404		{object}	ProblemNotFound	"`not_found`: no such endpoint in your organisation (or the id is not a UUID)."
//	@Failure		500		{object}	ProblemInternal			"common:internal"
//	@Failure		503		{object}	ProblemUnavailable		"common:unavailable"
//	@Router			/api/webhook-endpoints/{id}/deliveries/ [get]
func (h *webhookHandlers) deliveries(c *gin.Context) {
	id, ok := canonicalID(c.Param("id"))
	if !ok {
		problem.Write(c, notFound("Webhook endpoint"))
		return
	}
	page, ok := pageOf(c)
	if !ok {
		return
	}
	ds, next, err := h.endpoints.Deliveries(c.Request.Context(), principalOf(c).OrgID, id, page)
	answerEndpoint(c, err, func() {
		out := WebhookDeliveryList{Data: make([]WebhookDelivery, 0, len(ds)), NextCursor: cursorOf(next)}
		for i := range ds {
			out.Data = append(out.Data, deliveryOf(&ds[i]))
		}
		c.PureJSON(http.StatusOK, out)
	})
}

// deliveryOf shows a delivery.
func deliveryOf(d *models.WebhookDelivery) WebhookDelivery {
	if d.LastError != nil {
		shown := webhooks.Shown(*d.LastError) // never an address, whenever it was recorded
		d.LastError = &shown
	}
	return WebhookDelivery{ID: d.ID, EventID: d.EventID, EventType: d.EventType, RunID: d.RunID,
		Status: d.Status, Attempts: d.Attempts, LastStatusCode: d.LastStatusCode, LastError: d.LastError,
		NextAttemptAt: utc(d.NextAttemptAt), CreatedAt: d.CreatedAt.UTC(), DeliveredAt: utc(d.DeliveredAt)}
}

// maxPendingTests bounds the test events of one endpoint that wait for
// their attempt at once.
const maxPendingTests = 5

// redeliver godoc
//
//	@Summary		Send a webhook delivery again
//	@ID			redeliverWebhookDelivery
//	@Description	Makes one of the endpoint's deliveries due again at once, whatever its status (`delivered`, `failed` or `pending`): a worker makes a **new attempt of the same event**, within `WEBHOOK_POLL_INTERVAL` (1 s), with the same body and the same `webhook-id`, so a receiver that already handled the event drops it. The answer is the delivery as it now is: `pending`, its next attempt due now; follow it in the deliveries list.
//	@Description
//	@Description	If an attempt of the delivery is under way, it is left to finish (the event is never sent twice at once), and the delivery is due again at once when it does. An event older than `WEBHOOK_RETRY_HORIZON` (24 h) gets this one attempt: `failed` again if the receiver does not answer 2xx; a younger one is retried as before.
//	@Description
//	@Description	Send an `Idempotency-Key`: a retry with it gets the first answer back and asks for no further attempt.
//	@Tags			webhooks
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			id				path		string						true	"Webhook endpoint id (UUID)"	format(uuid)
//	@Param			delivery_id		path		string						true	"Delivery id (UUID), from the deliveries list"	format(uuid)
//	@Param			Idempotency-Key	header		string						false	"**A new value per redelivery you mean to ask for** (a UUID), the same on every retry of it; left empty, Try it out sends a new UUID.<br>1 to 255 printable ASCII characters. Optional unless the server sets `IDEMPOTENCY_KEY_REQUIRED=true`.<br>Same key and request: the first answer again. Same key, another delivery: 422. First still running: 409."	minlength(1)	maxlength(255)	extensions(x-pattern=^[!#-~][ -~]*$|^"[ !#-\x5b\x5d-~]+"$)
//	@Param			Prefer			header		string						false	"`wait=N` (RFC 7240): if a request with this Idempotency-Key is still being processed, wait up to N seconds (at most `IDEMPOTENCY_MAX_WAIT`) for its answer instead of a 409. The answer then carries `Preference-Applied: wait=N`. Other preferences are ignored."
//	@Success		202				{object}	WebhookDelivery				"Accepted: the delivery, due again; with `Idempotent-Replayed: true`, the replay of the first answer."
//	@Failure		400				{object}	ProblemBadRequest			"The Idempotency-Key is malformed: `idempotency_key_invalid`, `idempotency_key_too_long`, `idempotency_key_missing` (IDEMPOTENCY_KEY_REQUIRED=true)."
//	@Failure		401				{object}	ProblemUnauthorized			"common:unauthorized"
//	@Failure		404				{object}	ProblemNotFound		"`not_found`: no such delivery of this endpoint in your organisation (or an id is not a UUID); with a key, stored and replayed."
//	@Failure		409				{object}	ProblemInProgress			"`idempotency_key_in_progress`: a request with this key is still being processed; retry after `Retry-After` seconds, or send `Prefer: wait=N`."
//	@Failure		422				{object}	ProblemKeyReused			"`idempotency_key_reused`: the key was used for a different request (another delivery) within 24 h; use a new key."
//	@Failure		500				{object}	ProblemInternal				"`internal_error`: nothing was changed or stored; retry, with the same key."
//	@Failure		503				{object}	ProblemUnavailable			"common:unavailable_keyed"
//	@Header			202,404			{string}	Idempotent-Replayed			"`true` when this answer is the replay of an earlier request with the same Idempotency-Key (absent otherwise)."
//	@Header			202,404			{string}	Original-Request-Id			"On a replay: the X-Request-Id of the request that did the work."
//	@Header			202,404,422		{string}	Idempotency-Key-Expires		"With an Idempotency-Key, on an answer stored under it (and its replays) and on a 422: when the key expires (RFC 9110 HTTP-date)."
//	@Header			202,404,422		{string}	Preference-Applied			"`wait=N` when the request waited (`Prefer: wait=N`) for the first request with its key."
//	@Header			409,500		{integer}	Retry-After					"Seconds to wait before retrying."
//	@Router			/api/webhook-endpoints/{id}/deliveries/{delivery_id}/redeliver/ [post]
func (h *webhookHandlers) redeliver(tx *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
	ep, ok := canonicalID(req.Gin.Param("id"))
	id, ok2 := canonicalID(req.Gin.Param("delivery_id"))
	if !ok || !ok2 {
		return idempotency.Problem(req, notFound("Webhook delivery")), nil
	}
	d, err := h.endpoints.Redeliver(tx.DB(), principalOf(req.Gin).OrgID, ep, id)
	if errors.Is(err, models.ErrNotFound) {
		return idempotency.Problem(req, notFound("Webhook delivery")), nil
	}
	if err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.JSON(http.StatusAccepted, deliveryOf(d))
}

// sendTest godoc
//
//	@Summary		Send a test event to a webhook endpoint
//	@ID			sendWebhookTestEvent
//	@Description	Records a `webhook.test` event for the endpoint, whatever event types it subscribes to, and answers its delivery (`pending`). A worker sends it within `WEBHOOK_POLL_INTERVAL` (1 s), signed like any event, with the body `{"id": "evt_...", "type": "webhook.test", "created_at": "...", "data": {"endpoint_id": "..."}}`. It is **attempted once**: the deliveries list then shows it `delivered`, or `failed` with the answer's status code or the error (send another, or send this one again with the redeliver route).
//	@Description
//	@Description	At most 5 test events of one endpoint wait for their attempt at once: past that, 429 `test_events_pending` (stored under the key like any answer): wait for them, then send a new request with a new key. Send an `Idempotency-Key`: a retry with it gets the first answer back and records no second event.
//	@Tags			webhooks
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			id				path		string						true	"Webhook endpoint id (UUID)"	format(uuid)
//	@Param			Idempotency-Key	header		string						false	"**A new value per test event you mean to send** (a UUID), the same on every retry of it; left empty, Try it out sends a new UUID.<br>1 to 255 printable ASCII characters. Optional unless the server sets `IDEMPOTENCY_KEY_REQUIRED=true`.<br>Same key and request: the first answer again. Same key, another endpoint: 422. First still running: 409."	minlength(1)	maxlength(255)	extensions(x-pattern=^[!#-~][ -~]*$|^"[ !#-\x5b\x5d-~]+"$)
//	@Param			Prefer			header		string						false	"`wait=N` (RFC 7240): if a request with this Idempotency-Key is still being processed, wait up to N seconds (at most `IDEMPOTENCY_MAX_WAIT`) for its answer instead of a 409. The answer then carries `Preference-Applied: wait=N`. Other preferences are ignored."
//	@Success		202				{object}	WebhookDelivery				"Accepted: the test event's delivery; with `Idempotent-Replayed: true`, the replay of the first answer."
//	@Failure		400				{object}	ProblemBadRequest			"The Idempotency-Key is malformed: `idempotency_key_invalid`, `idempotency_key_too_long`, `idempotency_key_missing` (IDEMPOTENCY_KEY_REQUIRED=true)."
//	@Failure		401				{object}	ProblemUnauthorized			"common:unauthorized"
//	@Failure		404				{object}	ProblemNotFound		"`not_found`: no such endpoint in your organisation (or the id is not a UUID); with a key, stored and replayed."
//	@Failure		409				{object}	ProblemInProgress			"`idempotency_key_in_progress`: a request with this key is still being processed; retry after `Retry-After` seconds, or send `Prefer: wait=N`."
//	@Failure		422				{object}	ProblemKeyReused			"`idempotency_key_reused`: the key was used for a different request (another endpoint) within 24 h; use a new key."
//	@Failure		429				{object}	ProblemTooManyRequests	"`test_events_pending`: 5 test events of this endpoint are waiting for their attempt; stored under the key like any answer. Wait until the deliveries list shows them sent, then send a new request with a new key."
//	@Failure		500				{object}	ProblemInternal				"`internal_error`: nothing was recorded or stored; retry, with the same key."
//	@Failure		503				{object}	ProblemUnavailable			"common:unavailable_keyed"
//	@Header			202,404,429		{string}	Idempotent-Replayed			"`true` when this answer is the replay of an earlier request with the same Idempotency-Key (absent otherwise)."
//	@Header			202,404,429		{string}	Original-Request-Id			"On a replay: the X-Request-Id of the request that did the work."
//	@Header			202,404,422,429	{string}	Idempotency-Key-Expires		"With an Idempotency-Key, on an answer stored under it (and its replays) and on a 422: when the key expires (RFC 9110 HTTP-date)."
//	@Header			202,404,422,429	{string}	Preference-Applied			"`wait=N` when the request waited (`Prefer: wait=N`) for the first request with its key."
//	@Header			409,500		{integer}	Retry-After					"Seconds to wait before retrying."
//	@Router			/api/webhook-endpoints/{id}/test/ [post]
func (h *webhookHandlers) sendTest(tx *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
	ep, ok := canonicalID(req.Gin.Param("id"))
	if !ok {
		return idempotency.Problem(req, notFound("Webhook endpoint")), nil
	}
	d, err := h.endpoints.SendTestEvent(tx.DB(), principalOf(req.Gin).OrgID, ep, maxPendingTests)
	switch {
	case errors.Is(err, models.ErrNotFound):
		return idempotency.Problem(req, notFound("Webhook endpoint")), nil
	case errors.Is(err, models.ErrTestsPending):
		return idempotency.Problem(req, problem.New(http.StatusTooManyRequests, problem.TestEventsPending,
			fmt.Sprintf("%d test events of this endpoint are waiting for their attempt; wait for them, then send a new request with a new Idempotency-Key.", maxPendingTests))), nil
	case err != nil:
		return idempotency.Response{}, err
	}
	return idempotency.JSON(http.StatusAccepted, deliveryOf(d))
}
