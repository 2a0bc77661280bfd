package reliability

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valruns/valruns/validate"
)

// finalWithin bounds the wait, after the load (or the fault) ends, for every
// accepted run to be final: the promise that "a run held by a dead worker
// is taken over within a minute".
const finalWithin = 60 * time.Second

// drainBound caps how far verify waits past finalBy for a backlog that is
// still draining (runs becoming final): a machine too slow for that is
// reported, not waited on for ever.
const drainBound = 5 * time.Minute

// billedRuns is what the organisations are billed for: the total of their
// usage. It is the ONE place the suite knows where usage is kept, so when
// usage moves to another table only this query changes.
func billedRuns(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, `SELECT coalesce(sum(runs), 0) FROM usage_slots`).Scan(&n)
	return n, err
}

// op is one logical operation: a start of a run with its own key, retried
// by the client until it has a definitive answer.
type op struct {
	Key      string
	Org      org
	Workflow string // id
	Def      *workflowDef
	Variant  *variant
	Out      outcome
	// RunID is the run of the definitive 201 answer.
	RunID string
}

func (o *op) request() request {
	return request{Method: "POST", Path: "/api/workflows/" + o.Workflow + "/start/", Key: o.Key,
		Body: startBody(o.Variant, o.Key), Token: o.Org.Token}
}

// finish records the outcome and the run it names.
func (o *op) finish(out outcome) {
	o.Out = out
	if out.Definitive && out.Final.Status == 201 {
		var r struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(out.Final.Body, &r) == nil {
			o.RunID = r.ID
		}
	}
}

// lastAnswer is when the operation's last attempt ended.
func (o *op) lastAnswer() time.Time {
	if len(o.Out.Attempts) == 0 {
		return time.Time{}
	}
	return o.Out.Attempts[len(o.Out.Attempts)-1].At
}

// result is one scenario's row of the report.
type result struct {
	Name           string
	Ran            bool
	Failed         bool
	Ops            int
	Requests       int64
	Expected5xx    int
	Unexpected5xx  int
	Runs           int64
	Duplicates     int
	Losses         int
	Stranded       int
	Errored        int
	Recovery       time.Duration // from the fault to whole again; 0: no fault
	NotRecovered   bool
	Notes          []string // why it failed, short
	Figures        []string // measured figures, reported and never asserted (timings)
	faultInjection bool
}

// fail reports a failure in the test and in the report's notes.
func (r *result) fail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	t.Error(msg)
	short := strings.SplitN(msg, "\n", 2)[0]
	if len(short) > 240 {
		short = short[:240] + "..."
	}
	if len(r.Notes) < 12 {
		r.Notes = append(r.Notes, short)
	} else if len(r.Notes) == 12 {
		r.Notes = append(r.Notes, "(more in the test output)")
	}
}

// judge5xx sorts the 5xx answers the scenario's clients saw into expected
// (expected(e) true) and unexpected, and reports every unexpected one.
func (r *result) judge5xx(t testing.TB, rec *recorder, expected func(serverError) bool) {
	t.Helper()
	tally := map[string]int{}
	var kinds []string
	for _, e := range rec.serverErrors() {
		if expected != nil && expected(e) {
			r.Expected5xx++
			continue
		}
		r.Unexpected5xx++
		kind := fmt.Sprintf("%d %s", e.Status, cmp.Or(e.Code, "(no code)"))
		if e.RetryAfter == "" {
			kind += " without Retry-After"
		}
		if !e.Problem {
			kind += " (not a problem document)"
		}
		if tally[kind] == 0 {
			kinds = append(kinds, kind)
		}
		tally[kind]++
	}
	if r.Unexpected5xx > 0 {
		var parts []string
		for _, k := range kinds {
			parts = append(parts, fmt.Sprintf("%d × %s", tally[k], k))
		}
		r.fail(t, "%d unexpected 5xx answers: %s", r.Unexpected5xx, strings.Join(parts, ", "))
	}
}

// expectations is what verify checks beyond the operations themselves.
type expectations struct {
	// errorRuns are runs that must end in status error (rules past a limit).
	errorRuns map[string]string // run id -> what it is
	// foreignRuns are runs made outside ops that may end in any final state.
	foreignRuns map[string]bool
	// faultAt is when the fault was injected (zero: no fault).
	faultAt time.Time
	// finalBy is when every run must be final (zero: finalWithin after now).
	finalBy time.Time
}

type dbRun struct {
	ID, Org, Workflow, Status, Op, KeyID, Error string
	Attempts                                    int
}

type dbFinding struct {
	Position                      int
	Step, Severity, Path, Message string
}

// verify checks the operations' answers and the database after a scenario:
// one run per key, usage equal to runs, every run final within the bound,
// findings written once and equal to one execution's.
func verify(t *testing.T, c *cluster, res *result, ops []*op, exp expectations) {
	t.Helper()
	ctx := context.Background()
	res.Ops = len(ops)

	// The clients' view: every operation has its definitive 201.
	var lastAnswer time.Time
	for _, o := range ops {
		lastAnswer = maxTime(lastAnswer, o.lastAnswer())
		switch {
		case !o.Out.Definitive:
			res.Losses++
			last := "no answer at all"
			if n := len(o.Out.Attempts); n > 0 {
				a := o.Out.Attempts[n-1]
				last = fmt.Sprintf("status %d %s %s", a.Status, a.Code, a.Err)
			}
			res.fail(t, "operation %s: no definitive answer after %d attempts (last: %s)", o.Key, len(o.Out.Attempts), last)
		case o.Out.Final.Status != 201 || o.RunID == "":
			res.Losses++
			res.fail(t, "operation %s: definitive answer %d %s, want 201 with a run", o.Key, o.Out.Final.Status, clip(o.Out.Final.Body))
		}
	}

	// Every run final, within the bound.
	finalBy := exp.finalBy
	if finalBy.IsZero() {
		finalBy = time.Now().Add(finalWithin)
	}
	// A backlog still draining is not a stranded run: while runs keep
	// becoming final, the bound moves to finalWithin after the last of them
	// (at most drainBound past finalBy). On a quiet machine everything is
	// final long before finalBy; beside busy loops, the fault suite once
	// had 47 slow runs still queued, and draining, at finalBy. A run left
	// behind still fails: nothing else becomes final for finalWithin.
	var pending int64 = -1
	finalAt, deadline := time.Time{}, finalBy
	for {
		n, err1 := c.count(`SELECT count(*) FROM validation_runs WHERE status IN ('queued', 'running')`)
		if err1 == nil && n == 0 {
			pending, finalAt = 0, time.Now()
			break
		}
		if err1 == nil {
			if pending >= 0 && n < pending {
				if later := time.Now().Add(finalWithin); later.After(deadline) {
					deadline = later
				}
				if limit := finalBy.Add(drainBound); deadline.After(limit) {
					deadline = limit
				}
			}
			pending = n
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	finalBy = deadline
	if !exp.faultAt.IsZero() {
		res.faultInjection = true
		if finalAt.IsZero() {
			res.NotRecovered = true
		} else {
			res.Recovery = maxTime(finalAt, lastAnswer).Sub(exp.faultAt)
		}
	}

	runs, err := loadRuns(ctx, c.db)
	if err != nil {
		t.Fatalf("read runs: %v", err)
	}
	res.Runs = int64(len(runs))
	byID := map[string]*dbRun{}
	byOp := map[string][]*dbRun{}
	byKey := map[string]int{}
	for _, r := range runs {
		byID[r.ID] = r
		if r.Op != "" {
			byOp[r.Org+"|"+r.Op] = append(byOp[r.Org+"|"+r.Op], r)
		}
		if r.KeyID != "" {
			byKey[r.KeyID]++
		}
	}
	for _, r := range runs {
		if r.Status == "queued" || r.Status == "running" {
			res.Stranded++
		}
	}
	if res.Stranded > 0 {
		var ids []string
		for _, r := range runs {
			if (r.Status == "queued" || r.Status == "running") && len(ids) < 3 {
				what := ""
				if name := exp.errorRuns[r.ID]; name != "" {
					what = ", " + name
				}
				ids = append(ids, fmt.Sprintf("%s (%s, attempts %d%s)", r.ID, r.Status, r.Attempts, what))
			}
		}
		res.fail(t, "%d runs still not final at the deadline (%s), such as %s", res.Stranded,
			finalBy.Format("15:04:05"), strings.Join(ids, ", "))
	}

	// One run per key, through the ops' markers and through the keys table.
	keys, err := loadKeys(ctx, c.db)
	if err != nil {
		t.Fatalf("read keys: %v", err)
	}
	owned := map[string]bool{}
	for _, o := range ops {
		rs := byOp[o.Org.ID+"|"+o.Key]
		for _, r := range rs {
			owned[r.ID] = true
		}
		if len(rs) > 1 {
			res.Duplicates += len(rs) - 1
			res.fail(t, "operation %s made %d runs", o.Key, len(rs))
		}
		if o.RunID == "" {
			continue
		}
		if len(rs) == 0 {
			res.Losses++
			res.fail(t, "operation %s was accepted (run %s) but no run of it exists", o.Key, o.RunID)
			continue
		}
		if len(rs) == 1 && rs[0].ID != o.RunID {
			res.fail(t, "operation %s: answered run %s, the database has run %s", o.Key, o.RunID, rs[0].ID)
		}
		k, ok := keys[o.Org.ID+"|"+o.Key]
		switch {
		case !ok:
			res.fail(t, "operation %s: no key row stored for an accepted start", o.Key)
		case k.Status != 201 || k.RunID != o.RunID:
			res.fail(t, "operation %s: key row has status %d and run %q, want 201 and %s", o.Key, k.Status, k.RunID, o.RunID)
		}
	}
	for keyID, n := range byKey {
		if n > 1 {
			res.Duplicates += n - 1
			res.fail(t, "key %s is linked to %d runs", keyID, n)
		}
	}
	for _, r := range runs {
		if !owned[r.ID] && !exp.foreignRuns[r.ID] && exp.errorRuns[r.ID] == "" {
			res.Duplicates++
			res.fail(t, "run %s (op %q) belongs to no operation of the scenario", r.ID, r.Op)
		}
	}

	// Billed once per run.
	billed, err := billedRuns(ctx, c.db)
	if err != nil {
		res.fail(t, "read usage: %v", err)
	} else if billed != int64(len(runs)) {
		res.fail(t, "usage is %d, runs are %d: every run is billed exactly once", billed, len(runs))
	}

	// Runs ending error: only the ones that must.
	for _, r := range runs {
		want, mustErr := exp.errorRuns[r.ID]
		switch {
		case mustErr && r.Status != "error" && r.Status != "queued" && r.Status != "running":
			res.fail(t, "run %s (%s) ended %s, want error (a rule past a limit)", r.ID, want, r.Status)
		case !mustErr && r.Status == "error":
			res.Errored++
			res.fail(t, "run %s ended error although its submission is valid for execution: %s", r.ID, r.Error)
		}
	}

	// Findings: written once, positions 0..n-1, equal to one execution's.
	findings, err := loadFindings(ctx, c.db)
	if err != nil {
		t.Fatalf("read findings: %v", err)
	}
	for runID, fs := range findings {
		for i, f := range fs {
			if f.Position != i {
				res.fail(t, "run %s: findings at positions %v, want 0..%d once each", runID, positions(fs), len(fs)-1)
				break
			}
		}
		if r := byID[runID]; r != nil && (r.Status == "queued" || r.Status == "running") && len(fs) > 0 {
			res.fail(t, "run %s is %s but has %d findings", runID, r.Status, len(fs))
		}
	}
	for _, o := range ops {
		r := byID[o.RunID]
		if r == nil || (r.Status != "passed" && r.Status != "failed") {
			continue
		}
		if r.Status != o.Variant.Status {
			res.fail(t, "run %s of %s/%s ended %s, one execution yields %s", r.ID, o.Def.Name, o.Variant.Name, r.Status, o.Variant.Status)
		}
		if got, want := findings[r.ID], o.Variant.Findings; !sameFindings(got, want) {
			res.fail(t, "run %s of %s/%s has findings %v, one execution yields %v", r.ID, o.Def.Name, o.Variant.Name, got, want)
		}
	}
}

func loadRuns(ctx context.Context, db *sql.DB) ([]*dbRun, error) {
	rows, err := db.QueryContext(ctx, `SELECT id, org_id, workflow_id, status, coalesce(metadata->>'op', ''),
		coalesce(CAST(org_id AS text) || '|' || idempotency_key, ''), attempts, coalesce(error, '') FROM validation_runs`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*dbRun
	for rows.Next() {
		r := &dbRun{}
		if err := rows.Scan(&r.ID, &r.Org, &r.Workflow, &r.Status, &r.Op, &r.KeyID, &r.Attempts, &r.Error); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

type dbKey struct {
	Status int
	RunID  string
}

// loadKeys reads the start keys by org|key.
func loadKeys(ctx context.Context, db *sql.DB) (map[string]dbKey, error) {
	rows, err := db.QueryContext(ctx, `SELECT org_id, key, response_status, coalesce(CAST(validation_run_id AS text), '')
		FROM idempotency_keys WHERE endpoint = 'workflow_start'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]dbKey{}
	for rows.Next() {
		var orgID, key string
		var k dbKey
		if err := rows.Scan(&orgID, &key, &k.Status, &k.RunID); err != nil {
			return nil, err
		}
		out[orgID+"|"+key] = k
	}
	return out, rows.Err()
}

func loadFindings(ctx context.Context, db *sql.DB) (map[string][]dbFinding, error) {
	rows, err := db.QueryContext(ctx, `SELECT r.id, f.ord - 1, f.v->>'step', f.v->>'severity', coalesce(f.v->>'path', ''), f.v->>'message'
		FROM validation_runs r, json_array_elements(r.findings) WITH ORDINALITY AS f(v, ord) ORDER BY r.id, f.ord`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]dbFinding{}
	for rows.Next() {
		var id string
		var f dbFinding
		if err := rows.Scan(&id, &f.Position, &f.Step, &f.Severity, &f.Path, &f.Message); err != nil {
			return nil, err
		}
		out[id] = append(out[id], f)
	}
	return out, rows.Err()
}

func sameFindings(got []dbFinding, want []validate.Finding) bool {
	return slices.EqualFunc(got, want, func(g dbFinding, w validate.Finding) bool {
		return g.Step == w.Step && g.Severity == w.Severity && g.Path == w.Path && g.Message == w.Message
	})
}

func positions(fs []dbFinding) []int {
	out := make([]int, len(fs))
	for i, f := range fs {
		out[i] = f.Position
	}
	return out
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// clip shortens a body for a message.
func clip(b []byte) string {
	s := string(b)
	if len(s) > 300 {
		s = s[:300] + fmt.Sprintf("... (%d bytes)", len(b))
	}
	return s
}
