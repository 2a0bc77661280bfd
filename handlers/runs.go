package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/rfc3339"
	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

type runHandlers struct {
	runs         *models.RunStore
	defaultQuota int64
	// handOff gives a committed run to the queue (nil: the sweeper
	// delivers it, RUN_REDELIVER_AFTER later).
	handOff func(*models.QueuedRun)
	// maxWait caps a read's `Prefer: wait=N` (RUN_MAX_WAIT; 0: no read waits).
	maxWait time.Duration
	// waits are the reads waiting for their run to become final.
	waits *runWaits
}

// StartRunRequest is the body of POST /api/workflows/{id}/start/. A member
// it does not name is refused (400 validation_error).
type StartRunRequest struct {
	// Submission is the JSON document to validate: any JSON value (an
	// object, an array, a string, a number, true, false or null). A number
	// in it may have at most 256 digits written out in decimal: 1e300 is a
	// 400 `invalid_number`; no string or member name in it may hold the NUL
	// character \u0000: a 400 `validation_error` (rules JSON Schema cannot
	// state of any JSON value).
	Submission json.RawMessage `json:"submission" validate:"required"`
	// Metadata is an optional JSON object (null is the same as absent), visible to CEL assertions as `metadata`; no string or member name in it may hold the NUL character \u0000.
	Metadata json.RawMessage `json:"metadata,omitempty" swaggertype:"object" extensions:"x-nullable"`
}

// Finding is one problem a run found.
type Finding struct {
	Step     string `json:"step" validate:"required" example:"schema"`
	Severity string `json:"severity" validate:"required" example:"error" enums:"error,warning,info"`
	Path     string `json:"path" validate:"required" example:"/total"`
	Message  string `json:"message" validate:"required" example:"got string, want number"`
}

// Run is a validation run as the API shows it.
type Run struct {
	ID         string `json:"id" validate:"required" format:"uuid" example:"5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a"`
	WorkflowID string `json:"workflow_id" validate:"required" format:"uuid" example:"0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a"`
	Status     string `json:"status" validate:"required" example:"queued" enums:"queued,running,passed,failed,error"`
	// Submission is the JSON value the run validates, as it was sent: any JSON value.
	Submission json.RawMessage `json:"submission" validate:"required"`
	// Metadata is the run's metadata, {} when none was sent.
	Metadata json.RawMessage `json:"metadata" validate:"required" swaggertype:"object"`
	// Findings are what the run found, once it has finished (passed, failed
	// or error; [] when it found nothing). Absent while the run is queued or
	// running.
	Findings *[]Finding `json:"findings,omitempty"`
	// Error says why the worker itself failed (status error).
	Error      *string    `json:"error,omitempty"`
	Attempts   int        `json:"attempts" validate:"required" minimum:"0" example:"0"`
	CreatedAt  time.Time  `json:"created_at" validate:"required" format:"date-time" example:"2026-11-22T10:00:00Z"`
	StartedAt  *time.Time `json:"started_at,omitempty" format:"date-time" example:"2026-11-22T10:00:01Z"`
	FinishedAt *time.Time `json:"finished_at,omitempty" format:"date-time" example:"2026-11-22T10:00:02Z"`
}

// RunSummary is a run as a list shows it: without its submission, metadata
// and findings, whose size the client chose, so that a page's size never
// depends on what the runs hold. Read the run (GET /api/runs/{id}/) for them.
type RunSummary struct {
	ID         string `json:"id" validate:"required" format:"uuid" example:"5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a"`
	WorkflowID string `json:"workflow_id" validate:"required" format:"uuid" example:"0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a"`
	Status     string `json:"status" validate:"required" example:"queued" enums:"queued,running,passed,failed,error"`
	// Error says why the worker itself failed (status error), at most 2000 characters.
	Error      *string    `json:"error,omitempty" maxLength:"2000"`
	Attempts   int        `json:"attempts" validate:"required" minimum:"0" example:"0"`
	CreatedAt  time.Time  `json:"created_at" validate:"required" format:"date-time" example:"2026-11-22T10:00:00Z"`
	StartedAt  *time.Time `json:"started_at,omitempty" format:"date-time" example:"2026-11-22T10:00:01Z"`
	FinishedAt *time.Time `json:"finished_at,omitempty" format:"date-time" example:"2026-11-22T10:00:02Z"`
}

// RunList is one page of runs, newest first, as summaries.
type RunList struct {
	Data []RunSummary `json:"data" validate:"required"`
	// NextCursor fetches the next page (?cursor=); absent on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// runOf shows a run; withFindings: with its findings when it has finished
// (r.Findings must then have been read).
func runOf(r *models.ValidationRun, withFindings bool) Run {
	out := Run{
		ID: r.ID, WorkflowID: r.WorkflowID, Status: r.Status, Submission: json.RawMessage(r.Submission),
		Metadata: json.RawMessage(r.Metadata), Error: r.Error,
		Attempts: r.Attempts, CreatedAt: r.CreatedAt.UTC(), StartedAt: utc(r.StartedAt), FinishedAt: utc(r.FinishedAt),
	}
	if withFindings && r.FinishedAt != nil {
		fs := []Finding{}
		if len(r.Findings) > 0 {
			// Written by the worker from []models.Finding: it reads back.
			_ = json.Unmarshal(r.Findings, &fs)
		}
		out.Findings = &fs
	}
	return out
}

// runSummaryOf shows a run in a list.
func runSummaryOf(r *models.ValidationRun) RunSummary {
	return RunSummary{ID: r.ID, WorkflowID: r.WorkflowID, Status: r.Status, Error: r.Error, Attempts: r.Attempts,
		CreatedAt: r.CreatedAt.UTC(), StartedAt: utc(r.StartedAt), FinishedAt: utc(r.FinishedAt)}
}

// RunEventData is a final run as a webhook event's data shows it: as GET
// /api/runs/{id}/ does, findings included (the worker's webhook sender is
// given it by the composition root: tasks cannot import handlers).
func RunEventData(r *models.ValidationRun) any { return runOf(r, true) }

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// start godoc
//
//	@Summary		Start a validation run
//	@ID			startRun
//	@Description	Creates a `queued` validation run of the workflow over the submission (any JSON value) and optional metadata (a JSON object). Poll the run at the `Location` until it has `passed`, `failed` or ended in `error`. Each start counts against the organisation's monthly quota (past it: 429 `quota_exceeded`).
//	@Description
//	@Description	Send a new `Idempotency-Key` per run and the same on every retry: retries then start one run and get the first answer back. The rules (replays, 422, 409, `Prefer: wait`, rate limit, overload) are in the **runs** section's description above.
//	@Tags			runs
//	@Accept			json
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			id				path		string					true	"Workflow id (UUID)"	format(uuid)
//	@Param			Idempotency-Key	header		string					false	"**A new value per run you mean to start** (a UUID), the same on every retry of it; left empty, Try it out sends a new UUID.<br>1 to 255 printable ASCII characters. Optional unless the server sets `IDEMPOTENCY_KEY_REQUIRED=true`.<br>Same key and request: the first answer again. Same key, other body: 422. First still running: 409. The rules: the runs section above."	minlength(1)	maxlength(255)	extensions(x-pattern=^[!#-~][ -~]*$|^"[ !#-\x5b\x5d-~]+"$)
//	@Param			Prefer			header		string					false	"`wait=N` (RFC 7240): if a request with this Idempotency-Key is still being processed, wait up to N seconds (at most `IDEMPOTENCY_MAX_WAIT`) for its answer instead of a 409. The answer then carries `Preference-Applied: wait=N`. Other preferences are ignored."
//	@Param			body			body		StartRunRequest			true	"The submission to validate, and optional metadata"
//	@Success		201				{object}	Run						"Created: the queued run; with `Idempotent-Replayed: true`, the replay of the first answer."
//	@Failure		400				{object}	ProblemBadRequest		"The body is not what the route needs: `validation_error` (submission missing, metadata not an object, a field the route does not take, a string or member name anywhere in the body that holds the NUL character \u0000), `invalid_json`, `invalid_number` (a number of more than 256 digits in decimal); or the Idempotency-Key is malformed: `idempotency_key_invalid`, `idempotency_key_too_long`, `idempotency_key_missing` (IDEMPOTENCY_KEY_REQUIRED=true). Nothing is stored for a bad key, bad JSON or a bad number; a `validation_error` with a key is stored and replayed."
//	@Failure		401				{object}	ProblemUnauthorized		"common:unauthorized"
//	@Failure		404				{object}	ProblemNotFound	"`not_found`: no such workflow in your organisation (stored and replayed like any answer)."
//	@Failure		409				{object}	ProblemInProgress		"`idempotency_key_in_progress`: a request with this key is still being processed; retry after `Retry-After` seconds, or send `Prefer: wait=N`."
//	@Failure		408				{object}	ProblemBodyTimeout		"`request_body_timeout`: the body arrived slower than the server's read timeout; nothing was done or stored. Send the request again."
//	@Failure		413				{object}	ProblemTooLarge			"`request_body_too_large`: the body exceeds MAX_BODY_BYTES (nothing is stored)."
//	@Failure		415				{object}	ProblemUnsupportedEncoding	"`unsupported_content_encoding`: a Content-Encoding other than gzip (a gzip body is decoded, and MAX_BODY_BYTES counts the decoded bytes); nothing is stored."
//	@Failure		422				{object}	ProblemKeyReused		"`idempotency_key_reused`: the key was used for a different request (another body or another workflow) within 24 h; use a new key."
//	@Failure		429				{object}	ProblemTooManyRequests	"`quota_exceeded`: the organisation has used its monthly run quota (stored and replayed like any answer); do not retry. Or `rate_limited`: the organisation started runs faster than its rate; nothing was done or stored: retry after `Retry-After` seconds, with the same key."
//	@Failure		500				{object}	ProblemInternal			"`internal_error`: nothing was done, billed or stored; retry, with the same key."
//	@Failure		503				{object}	ProblemUnavailable		"common:unavailable_keyed"
//	@Header			201				{string}	Location				"The run: /api/runs/{run_id}/"
//	@Header			201,400,404,429				{string}	Idempotent-Replayed		"`true` when this answer is the replay of an earlier request with the same Idempotency-Key (absent otherwise): a stored 4xx is replayed like a 201."
//	@Header			201,400,404,429				{string}	Original-Request-Id		"On a replay: the X-Request-Id of the request that did the work."
//	@Header			201,400,404,422,429	{string}	Idempotency-Key-Expires	"With an Idempotency-Key, on an answer stored under it (and its replays) and on a 422: when the key expires, as an HTTP-date. Until then a retry gets this answer; after it, the key starts a new run."
//	@Header			201,422			{string}	Preference-Applied		"`wait=N` when the request waited (`Prefer: wait=N`) for the first request with its key."
//	@Header			409,429,500,503		{integer}	Retry-After				"Seconds to wait before retrying (on a 429: only `rate_limited`)."
//	@Header			201,400,404,408,409,413,422,429,500,503	{string}	RateLimit-Policy	"While the organisation has a start rate: `"org";q=N;w=1`, N starts per 1-second window (draft-ietf-httpapi-ratelimit-headers)."
//	@Header			201,400,404,408,409,413,422,429,500,503	{string}	RateLimit	"While the organisation has a start rate: `"org";r=R;t=T`, R starts left now, T seconds until the window is full again (on a 429 `rate_limited`: r=0, t the `Retry-After`)."
//	@Header			415				{string}	Accept-Encoding			"`gzip`: the one Content-Encoding accepted."
//	@Router			/api/workflows/{id}/start/ [post]
func (h *runHandlers) start(tx *models.RequestTx, req idempotency.Request, p models.StartParams) (idempotency.Response, error) {
	// The run is stamped when it is written, as in the one step: its id
	// and creation time are made in its transaction, not taken from
	// before the transaction began, when prepare stamped the one step's.
	p.ID, p.CreatedAt = models.NewRunID(), models.NewRunTime()
	err := h.runs.Start(tx, p)
	switch {
	case errors.Is(err, models.ErrNotFound):
		return idempotency.Problem(req, notFound("Workflow")), nil
	case errors.Is(err, models.ErrQuotaExceeded):
		return idempotency.Problem(req, problem.New(http.StatusTooManyRequests, problem.QuotaExceeded,
			fmt.Sprintf("The organisation has used its monthly quota of %d runs.", p.Quota))), nil
	case err != nil:
		return idempotency.Response{}, err
	}
	return h.created(req.Gin.Request.Context(), p)
}

// prepare reads a start's body, once, into the run to create. Its Commit is
// the one-step path (models.RunStore.StartOne), the common case; a start
// that path leaves NotDone goes to start, in a transaction, with what was
// read. A body refused with a problem is answered in a transaction too, so
// that the problem is stored with the key.
func (h *runHandlers) prepare(req idempotency.Request) (idempotency.Prepared[*models.RequestTx], error) {
	p, d := h.startParams(req)
	if d != nil {
		return idempotency.Prepared[*models.RequestTx]{Handle: func(_ *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
			return idempotency.Problem(req, *d), nil
		}}, nil
	}
	resp, err := h.created(req.Gin.Request.Context(), p)
	if err != nil {
		return idempotency.Prepared[*models.RequestTx]{}, err
	}
	return idempotency.Prepared[*models.RequestTx]{
		Response: resp,
		Commit: func(ctx context.Context, k *idempotency.Key) (idempotency.Result, error) {
			return h.runs.StartOne(ctx, p, k)
		},
		Handle: func(tx *models.RequestTx, req idempotency.Request) (idempotency.Response, error) {
			return h.start(tx, req, p)
		},
	}, nil
}

// startParams reads a start's body into the run to create, or the problem
// that refuses it.
func (h *runHandlers) startParams(req idempotency.Request) (models.StartParams, *problem.Details) {
	var in StartRunRequest
	if d := decodeStrict(req.Body, &in); d != nil {
		return models.StartParams{}, d
	}
	if in.Submission == nil {
		d := badRequest("submission is required: the JSON document to validate.",
			problem.FieldError{Field: "submission", Message: "required"})
		return models.StartParams{}, &d
	}
	if len(in.Metadata) > 0 && in.Metadata[0] != '{' && string(in.Metadata) != "null" {
		d := badRequest("metadata must be a JSON object.", problem.FieldError{Field: "metadata", Message: "must be an object"})
		return models.StartParams{}, &d
	}
	if string(in.Metadata) == "null" {
		in.Metadata = nil
	}
	pr := principalOf(req.Gin)
	wfID, ok := canonicalID(req.Gin.Param("id"))
	if !ok {
		d := notFound("Workflow")
		return models.StartParams{}, &d
	}
	quota := h.defaultQuota
	if pr.MonthlyRunQuota != nil {
		quota = *pr.MonthlyRunQuota
	}
	return models.StartParams{
		ID: models.NewRunID(), CreatedAt: models.NewRunTime(), OrgID: pr.OrgID, WorkflowID: wfID,
		Submission: in.Submission, Metadata: in.Metadata, Quota: quota,
		TokenID: pr.TokenID, RequestID: req.RequestID, IdempotencyKey: req.Key, RunShare: pr.RunShare,
	}, nil
}

// created is the answer to a start that created the run p: it is rendered
// before the run is written, from what the run will hold.
// The run's hand-off carries the request's id and trace context (ctx's span).
func (h *runHandlers) created(ctx context.Context, p models.StartParams) (idempotency.Response, error) {
	meta := p.Metadata
	if len(meta) == 0 {
		meta = []byte("{}")
	}
	run := models.ValidationRun{ID: p.ID, WorkflowID: p.WorkflowID, Status: models.RunQueued,
		Submission: models.JSON(p.Submission), Metadata: models.JSON(meta), CreatedAt: p.CreatedAt}
	resp, err := idempotency.JSON(http.StatusCreated, runOf(&run, false))
	if err != nil {
		return idempotency.Response{}, err
	}
	resp.Header.Set("Location", "/api/runs/"+p.ID+"/")
	resp.ResourceID = p.ID
	if h.handOff != nil {
		q := &models.QueuedRun{ID: p.ID, WorkflowID: p.WorkflowID, Submission: run.Submission, Metadata: run.Metadata,
			CreatedAt: p.CreatedAt, OrgID: p.OrgID, RunShare: p.RunShare,
			RequestID: p.RequestID, Trace: telemetry.Inject(ctx)}
		resp.AfterCommit = func() { h.handOff(q) }
	}
	return resp, nil
}

// get godoc
//
//	@Summary		Read a run
//	@ID			getRun
//	@Description	A run with its status and, once finished, its findings (`failed` means findings of severity `error`). Another organisation's run, or an id that is not a UUID, is a 404.
//	@Description
//	@Description	Long-poll: with `Prefer: wait=N`, a run still `queued` or `running` is answered once it is final (`passed`, `failed`, `error`), or after N seconds (at most `RUN_MAX_WAIT`) as it then is, with `Preference-Applied: wait=N`: one request instead of many polls. A final run is answered at once, with `Preference-Applied: wait=N` too.
//	@Tags			runs
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			id		path		string				true	"Run id (UUID)"	format(uuid)
//	@Param			Prefer	header		string				false	"`wait=N` (RFC 7240, N whole seconds): while the run is `queued` or `running`, wait up to N seconds (at most `RUN_MAX_WAIT`, 30 s by default) for it to become final, then answer it as it is: still not final when the time ran out is a 200 too. The answer then carries `Preference-Applied: wait=N`. Other preferences are ignored."
//	@Success		200	{object}	Run					"The run: final, or as it is when the wait (`Prefer: wait=N`) ran out."
//	@Failure		401	{object}	ProblemUnauthorized	"common:unauthorized"
//	@Failure		404	{object}	ProblemNotFound	"`not_found`: no such run in your organisation (or the id is not a UUID)."
//	@Failure		500	{object}	ProblemInternal		"common:internal"
//	@Failure		503	{object}	ProblemUnavailable	"common:unavailable"
//	@Header			200	{string}	Preference-Applied	"`wait=N` whenever the wait (`Prefer: wait=N`) was honoured, N the seconds applied (after the `RUN_MAX_WAIT` cap): the run was final already, became final, or the time ran out. Absent when the preference was ignored: the server waits for no request now (`RUN_MAX_WAIT=0`, or `RUN_MAX_WAITERS` wait already)."
//	@Router			/api/runs/{id}/ [get]
func (h *runHandlers) get(c *gin.Context) {
	id, ok := canonicalID(c.Param("id"))
	if !ok {
		problem.Write(c, notFound("Run"))
		return
	}
	org := principalOf(c).OrgID
	r, err := h.runs.Get(c.Request.Context(), org, id)
	if wait := idempotency.PreferredWait(c.Request.Header, h.maxWait); err == nil && wait > 0 {
		if r.Final() {
			// Honoured without waiting: the state waited for is here
			// already. Said all the same, so clients can rely on it.
			c.Header(idempotency.HeaderPreferenceApplied, idempotency.AppliedWait(wait))
		} else if w := h.waits.join(org, id); w != nil { // else too many wait: the preference is ignored
			// The wait holds no database connection (the read above gave
			// its back), and no room of the overload guard: hundreds of
			// long-polls must not keep starts out.
			leaveAdmission(c)
			if h.waits.wait(unbounded(c), w, wait) == waitGone {
				c.Abort() // no one to answer
				return
			}
			rebound(c) // the read's bound ran while it waited
			if r, err = h.runs.Get(c.Request.Context(), org, id); err == nil {
				c.Header(idempotency.HeaderPreferenceApplied, idempotency.AppliedWait(wait))
			}
		}
	}
	switch {
	case errors.Is(err, models.ErrNotFound):
		problem.Write(c, notFound("Run"))
	case err != nil:
		internalError(c, err)
	default:
		c.PureJSON(http.StatusOK, runOf(r, true))
	}
}

// list godoc
//
//	@Summary		List runs
//	@ID			listRuns
//	@Description	The organisation's runs, newest first, a page at a time: pass `next_cursor` back as `?cursor=` (with the same filters) for the next page. Each run is a summary, without its `submission`, `metadata` and `findings`: read a run for them. So a page's size does not depend on what the runs hold (at most 100 runs of at most 16 KiB each).
//	@Description
//	@Description	Filters combine: `workflow_id`, `status`, and the creation time (`created_after`, `created_before`: RFC 3339 date-times, both exclusive; a `+` in an offset is written `%2B` in a query). A filter sent is applied, whatever its value. With `status=passed`, `failed` or `error`, a page reads at most 2,000 runs: a page may then hold fewer runs than `limit`, even none, and still carry `next_cursor`; follow it until it is absent.
//	@Tags			runs
//	@Produce		json
//	@Produce		application/problem+json
//	@Security		BearerAuth
//	@Param			workflow_id		query		string				false	"Only runs of this workflow (UUID)"	format(uuid)
//	@Param			status			query		string				false	"Only runs in this status"	Enums(queued, running, passed, failed, error)
//	@Param			created_after	query		string				false	"Only runs created after this time (RFC 3339 date-time, such as 2026-11-22T10:00:00Z; exclusive)"	format(date-time)
//	@Param			created_before	query		string				false	"Only runs created before this time (RFC 3339 date-time; exclusive)"	format(date-time)
//	@Param			limit			query		int					false	"Page size, 1-100 (default 20)"		minimum(1)	maximum(100)
//	@Param			cursor			query		string				false	"next_cursor of the previous page"
//	@Success		200				{object}	RunList				"One page of runs."
//	@Failure		400				{object}	ProblemBadRequest	"`validation_error` naming the parameter (workflow_id not a UUID, status not one of queued, running, passed, failed, error, created_after or created_before not an RFC 3339 date-time, created_before not later than created_after, limit not 1 to 100, a query string that is not valid percent-encoding) or `invalid_cursor` (not a cursor this API returned)."
//	@Failure		401				{object}	ProblemUnauthorized	"common:unauthorized"
//	@Failure		500				{object}	ProblemInternal		"common:internal"
//	@Failure		503				{object}	ProblemUnavailable	"common:unavailable"
//	@Router			/api/runs/ [get]
func (h *runHandlers) list(c *gin.Context) {
	page, ok := pageOf(c)
	if !ok {
		return
	}
	f, d := runFilterOf(c)
	if d != nil {
		problem.Write(c, *d)
		return
	}
	rs, next, err := h.runs.List(c.Request.Context(), principalOf(c).OrgID, f, page)
	if err != nil {
		internalError(c, err)
		return
	}
	out := RunList{Data: make([]RunSummary, 0, len(rs)), NextCursor: cursorOf(next)}
	for i := range rs {
		out.Data = append(out.Data, runSummaryOf(&rs[i]))
	}
	c.PureJSON(http.StatusOK, out)
}

// runStatuses are the values of ?status=.
var runStatuses = []string{models.RunQueued, models.RunRunning, models.RunPassed, models.RunFailed, models.RunError}

// runFilterOf reads a list's filters, or the problem that refuses one. A
// filter sent is a filter, whatever its value: an empty one, or the zero
// time, is checked like any other, never taken for one not sent.
func runFilterOf(c *gin.Context) (models.RunFilter, *problem.Details) {
	var f models.RunFilter
	bad := func(field, msg, hint string) (models.RunFilter, *problem.Details) {
		d := badRequest(field+" "+msg+hint+".", problem.FieldError{Field: field, Message: msg})
		return models.RunFilter{}, &d
	}
	if wf, ok := c.GetQuery("workflow_id"); ok {
		id, ok := canonicalID(wf)
		if !ok {
			return bad("workflow_id", "must be a UUID", "")
		}
		f.WorkflowID = id
	}
	if st, ok := c.GetQuery("status"); ok {
		if !slices.Contains(runStatuses, st) {
			return bad("status", "must be one of "+strings.Join(runStatuses, ", "), "")
		}
		f.Status = st
	}
	for _, b := range []struct {
		name string
		t    **time.Time
	}{{"created_after", &f.CreatedAfter}, {"created_before", &f.CreatedBefore}} {
		s, ok := c.GetQuery(b.name)
		if !ok {
			continue
		}
		t, err := rfc3339.Parse(s)
		if err != nil {
			hint := ", such as 2026-11-22T10:00:00Z"
			if strings.Contains(s, " ") {
				hint += " (a + in a query string is a space: write it %2B)"
			}
			return bad(b.name, "must be an RFC 3339 date-time", hint)
		}
		*b.t = &t
	}
	// Both bounds are exclusive: no time lies between a pair whose
	// created_before is not later than its created_after.
	if f.CreatedAfter != nil && f.CreatedBefore != nil && !f.CreatedBefore.After(*f.CreatedAfter) {
		return bad("created_before", "must be later than created_after", " (both bounds are exclusive)")
	}
	return f, nil
}
