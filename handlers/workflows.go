package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
	"github.com/valruns/valruns/validate"
)

type workflowHandlers struct {
	workflows *models.WorkflowStore
}

// CreateWorkflowRequest is the body of POST /api/workflows/.
type CreateWorkflowRequest struct {
	// Name of the workflow, 1-200 characters.
	Name string `json:"name" example:"invoice"`
	// Schema is an optional JSON Schema (draft 2020-12 unless $schema says otherwise) the submission must satisfy.
	Schema json.RawMessage `json:"schema,omitempty" swaggertype:"object"`
	// Assertions are optional CEL rules over `submission` and `metadata`.
	Assertions []validate.Assertion `json:"assertions,omitempty"`
}

// Workflow is a workflow as the API shows it.
type Workflow struct {
	ID         string               `json:"id" example:"0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a"`
	Name       string               `json:"name" example:"invoice"`
	Schema     json.RawMessage      `json:"schema,omitempty" swaggertype:"object"`
	Assertions []validate.Assertion `json:"assertions"`
	CreatedAt  time.Time            `json:"created_at"`
}

// WorkflowList is one page of workflows, newest first.
type WorkflowList struct {
	Data []Workflow `json:"data"`
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
//	@Description	Creates a workflow: a name, an optional JSON Schema and optional CEL assertions, all compiled now, so a schema or an expression that does not compile is a 400 naming it.
//	@Tags			workflows
//	@Accept			json
//	@Produce		json
//	@Security		BearerAuth
//	@Param			Idempotency-Key	header		string					false	"Optional idempotency key (scope workflow_create)"
//	@Param			body			body		CreateWorkflowRequest	true	"The workflow"
//	@Success		201				{object}	Workflow
//	@Router			/api/workflows/ [post]
func (h *workflowHandlers) create(tx *gorm.DB, req idempotency.Request) (idempotency.Response, error) {
	var in CreateWorkflowRequest
	if err := decodeStrict(req.Body, &in); err != nil {
		return idempotency.Problem(req, badRequest(err.Error())), nil
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
		d := problem.New(http.StatusBadRequest, "invalid_workflow", what+" does not compile: "+ce.Msg)
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
	if err := h.workflows.Create(tx, w); err != nil {
		return idempotency.Response{}, err
	}
	resp, err := idempotency.JSON(http.StatusCreated, workflowOf(w))
	resp.Header.Set("Location", "/api/workflows/"+w.ID+"/")
	return resp, err
}

// list godoc
//
//	@Summary		List workflows
//	@Description	The organisation's workflows, newest first, a page at a time: pass next_cursor back as ?cursor= for the next page.
//	@Tags			workflows
//	@Produce		json
//	@Security		BearerAuth
//	@Param			limit	query		int		false	"Page size, 1-100 (default 20)"
//	@Param			cursor	query		string	false	"next_cursor of the previous page"
//	@Success		200		{object}	WorkflowList
//	@Router			/api/workflows/ [get]
func (h *workflowHandlers) list(c *gin.Context) {
	page, ok := pageOf(c)
	if !ok {
		return
	}
	ws, next, err := h.workflows.List(c.Request.Context(), principalOf(c).OrgID, page)
	if err != nil {
		listFailed(c, err)
		return
	}
	out := WorkflowList{Data: make([]Workflow, 0, len(ws)), NextCursor: next}
	for i := range ws {
		out.Data = append(out.Data, workflowOf(&ws[i]))
	}
	c.JSON(http.StatusOK, out)
}

// get godoc
//
//	@Summary		Read a workflow
//	@Description	One workflow of the organisation; another organisation's is a 404.
//	@Tags			workflows
//	@Produce		json
//	@Security		BearerAuth
//	@Param			id	path		string	true	"Workflow id (UUID)"
//	@Success		200	{object}	Workflow
//	@Router			/api/workflows/{id}/ [get]
func (h *workflowHandlers) get(c *gin.Context) {
	id := c.Param("id")
	if !validID(id) {
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
		c.JSON(http.StatusOK, workflowOf(w))
	}
}
