package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
	"github.com/valruns/valruns/validate"
)

type workflowHandlers struct {
	workflows *models.WorkflowStore
}

// CreateWorkflowRequest is the body of POST /api/workflows/. A member it
// does not name is refused (400 validation_error).
type CreateWorkflowRequest struct {
	// Name of the workflow, 1-200 characters, not only spaces, without the NUL character \u0000.
	Name string `json:"name" validate:"required" minLength:"1" maxLength:"200" extensions:"x-pattern=\\S" example:"invoice"`
	// Schema is an optional JSON Schema (draft 2020-12 unless $schema says otherwise) the submission must satisfy:
	// an object, or true or false; null is the same as absent. Any other JSON value is a 400 `invalid_workflow`;
	// a string or member name in it that holds the NUL character \u0000 is a 400 `validation_error`.
	Schema json.RawMessage `json:"schema,omitempty" extensions:"x-json-types=object|boolean|null"`
	// Assertions are optional CEL rules over `submission` and `metadata`, without the NUL character \u0000.
	Assertions []validate.Assertion `json:"assertions,omitempty"`
}

// Workflow is a workflow as the API shows it.
type Workflow struct {
	ID   string `json:"id" validate:"required" format:"uuid" example:"0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a"`
	Name string `json:"name" validate:"required" example:"invoice"`
	// Schema is the workflow's JSON Schema (an object, or true or false); absent when it has none.
	Schema     json.RawMessage      `json:"schema,omitempty" extensions:"x-json-types=object|boolean"`
	Assertions []validate.Assertion `json:"assertions" validate:"required"`
	CreatedAt  time.Time            `json:"created_at" validate:"required" format:"date-time" example:"2026-11-22T10:00:00Z"`
}

// WorkflowSummary is a workflow as a list shows it: without its schema and
// assertions, whose size the client chose, so that a page's size never
// depends on what the workflows hold. Read the workflow for them.
type WorkflowSummary struct {
	ID        string    `json:"id" validate:"required" format:"uuid" example:"0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a"`
	Name      string    `json:"name" validate:"required" example:"invoice"`
	CreatedAt time.Time `json:"created_at" validate:"required" format:"date-time" example:"2026-11-22T10:00:00Z"`
}

// WorkflowList is one page of workflows, newest first, as summaries.
type WorkflowList struct {
	Data []WorkflowSummary `json:"data" validate:"required"`
	// NextCursor fetches the next page (?cursor=); absent on the last page.
	NextCursor string `json:"next_cursor,omitempty" example:"MjAyNi0xMS0yMlQwMjo0MDo"`
}

func workflowOf(w *models.Workflow) Workflow {
	out := Workflow{ID: w.ID, Name: w.Name, Schema: json.RawMessage(w.Schema), CreatedAt: w.CreatedAt.UTC(), Assertions: []validate.Assertion{}}
	if len(w.Assertions) > 0 {
		_ = json.Unmarshal(w.Assertions, &out.Assertions) // written by create, always a valid array
	}
	return out
}

// create godoc
//
//	@Summary		Create a workflow
//	@ID			createWorkflow
//	@Description	Creates a workflow: a name, an optional JSON Schema (draft 2020-12 unless `$schema` says otherwise) the submission must satisfy, and optional CEL assertions over `submission` and `metadata`. Both are compiled now, so a schema or an expression that does not compile is a 400 (`invalid_workflow`) naming it in `errors`.
//	@Description
//	@Description	Send a new `Idempotency-Key` per workflow and the same on every retry: retries then create one workflow and get the first answer back. The rules (replays, 422, 409, `Prefer: wait`) are in the **workflows** section's description above.
//	@Tags			workflows
//	@Accept			json
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			Idempotency-Key	header		string					false	"**A new value per workflow you mean to create** (a UUID), the same on every retry of it; left empty, Try it out sends a new UUID.<br>1 to 255 printable ASCII characters. Optional unless the server sets `IDEMPOTENCY_KEY_REQUIRED=true`.<br>Same key and request: the first answer again. Same key, other body: 422. First still running: 409. The rules: the workflows section above."	minlength(1)	maxlength(255)	extensions(x-pattern=^[!#-~][ -~]*$|^"[ !#-\x5b\x5d-~]+"$)
//	@Param			Prefer			header		string					false	"`wait=N` (RFC 7240): if a request with this Idempotency-Key is still being processed, wait up to N seconds (at most `IDEMPOTENCY_MAX_WAIT`) for its answer instead of a 409. The answer then carries `Preference-Applied: wait=N`. Other preferences are ignored."
//	@Param			body			body		CreateWorkflowRequest	true	"The workflow"
//	@Success		201				{object}	Workflow				"Created; with `Idempotent-Replayed: true`, the replay of the first answer."
//	@Failure		400				{object}	ProblemBadRequest	"The body is not what the route needs: `invalid_workflow` (a schema that is not an object, true or false, or a schema or expression that does not compile), `validation_error` (name missing or too long, a field the route does not take, a string or member name anywhere in the body that holds the NUL character \u0000), `invalid_json`, `invalid_number` (a number of more than 256 digits in decimal); or the Idempotency-Key is malformed: `idempotency_key_invalid`, `idempotency_key_too_long`, `idempotency_key_missing` (IDEMPOTENCY_KEY_REQUIRED=true). Nothing is stored for a bad key, bad JSON or a bad number; `invalid_workflow` and `validation_error` with a key are stored and replayed."
//	@Failure		401				{object}	ProblemUnauthorized		"common:unauthorized"
//	@Failure		409				{object}	ProblemInProgress		"`idempotency_key_in_progress`: a request with this key is still being processed; retry after `Retry-After` seconds, or send `Prefer: wait=N`."
//	@Failure		408				{object}	ProblemBodyTimeout		"`request_body_timeout`: the body arrived slower than the server's read timeout; nothing was done or stored. Send the request again."
//	@Failure		413				{object}	ProblemTooLarge			"`request_body_too_large`: the body exceeds MAX_BODY_BYTES (nothing is stored)."
//	@Failure		415				{object}	ProblemUnsupportedEncoding	"`unsupported_content_encoding`: a Content-Encoding other than gzip (a gzip body is decoded, and MAX_BODY_BYTES counts the decoded bytes); nothing is stored."
//	@Failure		422				{object}	ProblemKeyReused		"`idempotency_key_reused`: the key was used for a different request (another body) within 24 h; use a new key."
//	@Failure		500				{object}	ProblemInternal			"`internal_error`: nothing was done and nothing stored; retry, with the same key."
//	@Failure		503				{object}	ProblemUnavailable		"common:unavailable_keyed"
//	@Header			201				{string}	Location				"The workflow: /api/workflows/{id}/"
//	@Header			201,400				{string}	Idempotent-Replayed		"`true` when this answer is the replay of an earlier request with the same Idempotency-Key (absent otherwise): a stored 4xx is replayed like a 201."
//	@Header			201,400				{string}	Original-Request-Id		"On a replay: the X-Request-Id of the request that did the work."
//	@Header			201,400,422		{string}	Idempotency-Key-Expires	"With an Idempotency-Key, on an answer stored under it (and its replays) and on a 422: when the key expires, as an HTTP-date. Until then a retry gets this answer; after it, the key creates a new workflow."
//	@Header			201,422			{string}	Preference-Applied		"`wait=N` when the request waited (`Prefer: wait=N`) for the first request with its key."
//	@Header			409,500		{integer}	Retry-After				"Seconds to wait before retrying."
//	@Header			415				{string}	Accept-Encoding			"`gzip`: the one Content-Encoding accepted."
//	@Router			/api/workflows/ [post]
func (h *workflowHandlers) create(tx *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
	var in CreateWorkflowRequest
	if d := decodeStrict(req.Body, &in); d != nil {
		return idempotency.Problem(req, *d), nil
	}
	in.Name = strings.TrimSpace(in.Name)
	if in.Name == "" || utf8.RuneCountInString(in.Name) > 200 {
		return idempotency.Problem(req, badRequest("name is required, 1 to 200 characters.",
			problem.FieldError{Field: "name", Message: "1 to 200 characters"})), nil
	}
	if string(in.Schema) == "null" {
		in.Schema = nil
	}
	_, assertions, err := validate.Compile(in.Schema, in.Assertions)
	var ce *validate.CompileError
	if errors.As(err, &ce) {
		what := ce.Field
		if ce.Name != "" {
			what += " (" + ce.Name + ")"
		}
		d := problem.New(http.StatusBadRequest, problem.InvalidWorkflow, what+" does not compile: "+ce.Msg)
		d.Errors = []problem.FieldError{{Field: ce.Field, Message: ce.Msg}}
		return idempotency.Problem(req, d), nil
	}
	if err != nil {
		return idempotency.Response{}, err
	}
	if assertions == nil {
		assertions = []validate.Assertion{}
	}
	ab, err := json.Marshal(assertions)
	if err != nil {
		return idempotency.Response{}, err
	}
	w := &models.Workflow{OrgID: principalOf(req.Gin).OrgID, Name: in.Name, Schema: models.JSON(in.Schema), Assertions: ab}
	if err := h.workflows.Create(tx.DB(), w); err != nil {
		return idempotency.Response{}, err
	}
	resp, err := idempotency.JSON(http.StatusCreated, workflowOf(w))
	if err != nil {
		return idempotency.Response{}, err
	}
	resp.Header.Set("Location", "/api/workflows/"+w.ID+"/")
	return resp, nil
}

// list godoc
//
//	@Summary		List workflows
//	@ID			listWorkflows
//	@Description	The organisation's workflows, newest first, a page at a time: pass `next_cursor` back as `?cursor=` for the next page; the last page has no `next_cursor`. Each workflow is a summary, without its `schema` and `assertions`: read a workflow for them. So a page's size does not depend on what the workflows hold.
//	@Tags			workflows
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			limit	query		int					false	"Page size, 1-100 (default 20)"	minimum(1)	maximum(100)
//	@Param			cursor	query		string				false	"next_cursor of the previous page"
//	@Success		200		{object}	WorkflowList		"One page of workflows."
//	@Failure		400		{object}	ProblemBadRequest	"`validation_error` (limit is not 1 to 100, a query string that is not valid percent-encoding) or `invalid_cursor` (not a cursor this API returned)."
//	@Failure		401		{object}	ProblemUnauthorized	"common:unauthorized"
//	@Failure		500		{object}	ProblemInternal		"common:internal"
//	@Failure		503		{object}	ProblemUnavailable	"common:unavailable"
//	@Router			/api/workflows/ [get]
func (h *workflowHandlers) list(c *gin.Context) {
	page, ok := pageOf(c)
	if !ok {
		return
	}
	ws, next, err := h.workflows.List(c.Request.Context(), principalOf(c).OrgID, page)
	if err != nil {
		internalError(c, err)
		return
	}
	out := WorkflowList{Data: make([]WorkflowSummary, 0, len(ws)), NextCursor: cursorOf(next)}
	for i := range ws {
		out.Data = append(out.Data, WorkflowSummary{ID: ws[i].ID, Name: ws[i].Name, CreatedAt: ws[i].CreatedAt.UTC()})
	}
	c.PureJSON(http.StatusOK, out)
}

// get godoc
//
//	@Summary		Read a workflow
//	@ID			getWorkflow
//	@Description	One workflow of the organisation. Another organisation's workflow, or an id that is not a UUID, is a 404.
//	@Tags			workflows
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			id	path		string					true	"Workflow id (UUID)"	format(uuid)
//	@Success		200	{object}	Workflow				"The workflow."
//	@Failure		401	{object}	ProblemUnauthorized		"common:unauthorized"
//	@Failure		404	{object}	ProblemNotFound	"`not_found`: no such workflow in your organisation (or the id is not a UUID)."
//	@Failure		500	{object}	ProblemInternal			"common:internal"
//	@Failure		503	{object}	ProblemUnavailable		"common:unavailable"
//	@Router			/api/workflows/{id}/ [get]
func (h *workflowHandlers) get(c *gin.Context) {
	id, ok := canonicalID(c.Param("id"))
	if !ok {
		problem.Write(c, notFound("Workflow"))
		return
	}
	w, err := h.workflows.Get(c.Request.Context(), principalOf(c).OrgID, id)
	switch {
	case errors.Is(err, models.ErrNotFound):
		problem.Write(c, notFound("Workflow"))
	case err != nil:
		internalError(c, err)
	default:
		c.PureJSON(http.StatusOK, workflowOf(w))
	}
}
