// Package workload is the heavy workflow that the fault suite (reliability/)
// and the benchmark (tools/bench/) start runs of: CEL rules that each scan a
// large array of the submission, slow but within every limit of the
// validation engine. One definition, so that "a slow run" means the same
// work in both places.
package workload

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/valruns/valruns/validate"
)

// The suite's and the benchmark's slow runs: SlowChecks scans of SlowItems
// integers. cel-go's comprehension cost grows faster than linearly with the
// list: the scans alone take about 0.1 s of one core per run on the
// project's 2-core machine (measured in process, beside other work), each
// far below the engine's own per-assertion limits.
const (
	SlowItems  = 5000
	SlowChecks = 12
)

// SlowSchema asks for an array of non-negative integers under "items" and
// a "warehouse".
var SlowSchema = json.RawMessage(`{"type":"object","required":["items","warehouse"],
		"properties":{"items":{"type":"array","items":{"type":"integer","minimum":0}}}}`)

// Scans are n assertions, each over every element of submission.items:
// true for any list of non-negative integers, so they add no finding.
func Scans(n int) []validate.Assertion {
	out := make([]validate.Assertion, n)
	for i := range out {
		out[i] = validate.Assertion{Name: fmt.Sprintf("scan_%d", i),
			Expr: fmt.Sprintf("submission.items.all(i, i >= %d)", -i), Severity: "error"}
	}
	return out
}

// Items is the submission {"items":[0,1,...,n-1]}.
func Items(n int) json.RawMessage {
	var sb strings.Builder
	sb.WriteString(`{"items":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, i)
	}
	sb.WriteString(`]}`)
	return json.RawMessage(sb.String())
}
