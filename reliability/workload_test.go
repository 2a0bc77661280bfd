package reliability

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/valruns/valruns/internal/workload"
	"github.com/valruns/valruns/validate"
)

// A workflow the scenarios start runs of, with the submissions they send.
// What a run of each submission must end with (status and findings) is
// computed here by the validation engine itself, in process, so the check
// "findings written once and equal to what one execution yields" compares
// against the engine, not against a hand-written list.
type workflowDef struct {
	Name       string
	Schema     json.RawMessage
	Assertions []validate.Assertion
	Variants   []*variant
	// expectFrom, when set, is the workflow whose engine result a run of this
	// one must equal (see slowWorkflow).
	expectFrom *workflowDef
}

// variant is one submission of a workflow and what one execution yields.
type variant struct {
	Name       string
	Submission json.RawMessage
	Status     string // passed or failed
	Findings   []validate.Finding
}

// orderWorkflow is cheap: its runs take milliseconds.
func orderWorkflow() *workflowDef {
	return &workflowDef{
		Name: "order",
		Schema: json.RawMessage(`{"type":"object","required":["customer","total"],
			"properties":{"customer":{"type":"string","minLength":1},"total":{"type":"number"}}}`),
		Assertions: []validate.Assertion{
			{Name: "positive_total", Expr: "submission.total > 0", Severity: "error", Message: "total must be positive"},
			{Name: "large_total", Expr: "submission.total < 10000", Severity: "warning", Message: "total is unusually large"},
		},
		Variants: []*variant{
			{Name: "valid", Submission: json.RawMessage(`{"customer":"ACME","total":42}`)},
			{Name: "invalid", Submission: json.RawMessage(`{"customer":"","total":-5}`)},
			{Name: "large", Submission: json.RawMessage(`{"customer":"Big","total":20000}`)},
			{Name: "not_object", Submission: json.RawMessage(`[1,2,3]`)},
		},
	}
}

// slowWorkflow's runs keep a worker busy long enough to be killed mid-run:
// the shared heavy workload (internal/workload). Its expected results come from its
// light twin: the same schema and the same cheap assertion without the
// scans, which are true for any list of non-negative integers and so add no
// finding (evaluating them in process, under the race detector, would take
// minutes).
func slowWorkflow() *workflowDef {
	light := validate.Assertion{Name: "has_warehouse", Expr: "has(submission.warehouse)", Severity: "error", Message: "a warehouse is required"}
	asserts := append(workload.Scans(workload.SlowChecks), light)
	v := []*variant{{Name: "inventory", Submission: workload.Items(workload.SlowItems)}}
	twin := &workflowDef{Name: "inventory-light", Schema: workload.SlowSchema, Assertions: []validate.Assertion{light}, Variants: v}
	return &workflowDef{Name: "inventory", Schema: workload.SlowSchema, Assertions: asserts, Variants: v, expectFrom: twin}
}

// compute fills each variant's expected status and findings by running the
// validation engine once.
func (w *workflowDef) compute(t testing.TB) {
	t.Helper()
	src := w
	if w.expectFrom != nil {
		src = w.expectFrom
	}
	prog, _, err := validate.Compile(src.Schema, src.Assertions)
	if err != nil {
		t.Fatalf("workflow %s does not compile in process: %v", src.Name, err)
	}
	for _, v := range w.Variants {
		f, err := prog.Run(context.Background(), v.Submission, nil)
		if err != nil {
			t.Fatalf("workflow %s, submission %s: %v", src.Name, v.Name, err)
		}
		v.Findings = f
		v.Status = "passed"
		if validate.Failed(f) {
			v.Status = "failed"
		}
	}
}

// createBody is the POST /api/workflows/ body of the workflow.
func (w *workflowDef) createBody() string {
	b, _ := json.Marshal(map[string]any{"name": w.Name, "schema": w.Schema, "assertions": w.Assertions})
	return string(b)
}

// startBody is the start body of a variant, with the operation's key as a
// metadata marker: the database check finds every run an operation made by
// it, whatever the service linked or did not link.
func startBody(v *variant, opKey string) string {
	b, _ := json.Marshal(map[string]any{"submission": v.Submission, "metadata": map[string]string{"op": opKey}})
	return string(b)
}
