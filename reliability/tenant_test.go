package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// tenant is an organisation with what it created, for probing.
type tenant struct {
	org       org
	workflow  string
	ops       []*op
	runs      []string
	runCursor string // next_cursor of its first page of runs
	wfCursor  string // next_cursor of its first page of workflows
	workflows []string
}

// tenantProbing: two organisations, each with workflows, runs and keys.
// Each probes the other's ids, keys and cursors through both replicas: the
// answer is always a 404 or the prober's own data, never the other's. A key
// of the other organisation is an independent key (its own answer, its own
// run), and every answer is scanned for the other's ids.
func tenantProbing(t *testing.T, s *suite, res *result) {
	c, cl, rec, orgA := setup(t, s, "tenant-a")
	orgB := c.newOrg("tenant-b")
	ctx := context.Background()
	def := orderWorkflow()
	def2 := orderWorkflow()
	def2.Name = "order-2"
	var tenants []*tenant
	var ops []*op
	for _, o := range []org{orgA, orgB} {
		tn := &tenant{org: o}
		tn.workflow = createWorkflow(t, cl, o, def)
		tn.workflows = []string{tn.workflow, createWorkflow(t, cl, o, def2)}
		tn.ops = makeOps(o.Name, 6, o, tn.workflow, def)
		startLoad(ctx, cl, tn.ops, 3).wait()
		for _, op := range tn.ops {
			tn.runs = append(tn.runs, op.RunID)
		}
		ops = append(ops, tn.ops...)
		tenants = append(tenants, tn)
	}
	for _, tn := range tenants {
		var page struct {
			NextCursor string `json:"next_cursor"`
		}
		if a := get(ctx, t, cl, tn.org.Token, "/api/runs/?limit=2", 0); a.Status == 200 {
			_ = json.Unmarshal(a.Body, &page)
			tn.runCursor = page.NextCursor
		}
		page.NextCursor = ""
		if a := get(ctx, t, cl, tn.org.Token, "/api/workflows/?limit=1", 1); a.Status == 200 {
			_ = json.Unmarshal(a.Body, &page)
			tn.wfCursor = page.NextCursor
		}
		if tn.runCursor == "" || tn.wfCursor == "" {
			t.Fatalf("%s: no next_cursor to probe with (runs %q, workflows %q)", tn.org.Name, tn.runCursor, tn.wfCursor)
		}
	}

	probes := 0
	for i, x := range tenants {
		y := tenants[1-i]
		// check sends one request as x and judges the answer: status among
		// want, and no secret of y unless x's own request carried it.
		check := func(name string, req request, replica int, want ...int) *answer {
			t.Helper()
			probes++
			req.Token = x.org.Token
			out := cl.do(ctx, req, replica)
			if !out.Definitive {
				res.fail(t, "%s probing %s: %s: no definitive answer: %s", x.org.Name, y.org.Name, name, lastOf(out))
				return nil
			}
			a := out.Final
			if !slices.Contains(want, a.Status) {
				res.fail(t, "%s probing %s: %s: answered %d, want %v: %s", x.org.Name, y.org.Name, name, a.Status, want, clip(a.Body))
			}
			sent := req.Path + " " + req.Body + " " + req.Key
			for _, secret := range y.secrets() {
				if strings.Contains(string(a.Body), secret) && !strings.Contains(sent, secret) {
					res.fail(t, "%s probing %s: %s: the answer contains %s's %q: %s", x.org.Name, y.org.Name, name, y.org.Name, secret, clip(a.Body))
				}
			}
			return a
		}
		for r := range 2 { // through both replicas
			check("read the other's workflow", request{Method: "GET", Path: "/api/workflows/" + y.workflow + "/"}, r, 404)
			check("read the other's run", request{Method: "GET", Path: "/api/runs/" + y.runs[0] + "/"}, r, 404)
			check("read the other's run, upper-case id", request{Method: "GET", Path: "/api/runs/" + strings.ToUpper(y.runs[1]) + "/"}, r, 404)
			if a := check("list runs of the other's workflow", request{Method: "GET", Path: "/api/runs/?workflow_id=" + y.workflow}, r, 200); a != nil {
				if ids := listIDs(a); len(ids) > 0 {
					res.fail(t, "%s lists runs %v of %s's workflow", x.org.Name, ids, y.org.Name)
				}
			}
			if a := check("the other's runs cursor", request{Method: "GET", Path: "/api/runs/?limit=2&cursor=" + url.QueryEscape(y.runCursor)}, r, 200, 400); a != nil && a.Status == 200 {
				x.onlyOwn(t, res, "runs page from the other's cursor", listIDs(a), x.runs)
			}
			if a := check("the other's workflows cursor", request{Method: "GET", Path: "/api/workflows/?limit=1&cursor=" + url.QueryEscape(y.wfCursor)}, r, 200, 400); a != nil && a.Status == 200 {
				x.onlyOwn(t, res, "workflows page from the other's cursor", listIDs(a), x.workflows)
			}
			if a := check("own runs", request{Method: "GET", Path: "/api/runs/?limit=100"}, r, 200); a != nil {
				x.onlyOwn(t, res, "own runs", listIDs(a), x.runs)
			}
			if a := check("own workflows", request{Method: "GET", Path: "/api/workflows/?limit=100"}, r, 200); a != nil {
				x.onlyOwn(t, res, "own workflows", listIDs(a), x.workflows)
			}
			check("the other's key", request{Method: "GET", Path: "/api/idempotency-keys/workflow_start/" + url.PathEscape(y.ops[2].Key)}, r, 404)
			check("usage", request{Method: "GET", Path: "/api/usage"}, r, 200, 404)
		}
		// The other's key and body on the other's workflow: x's own 404,
		// stored as x's, replayed as x's; never y's 201.
		replay := *y.ops[0]
		req := replay.request()
		if a := check("replay the other's start", req, 0, 404); a != nil && a.replayed() {
			res.fail(t, "%s's first use of %s's key was answered as a replay", x.org.Name, y.org.Name)
		}
		if a := check("replay the other's start again", req, 1, 404); a != nil && !a.replayed() {
			res.fail(t, "%s's second use of the key was not a replay of its own 404", x.org.Name)
		}
		// The other's key on x's own workflow: a new, independent key of x.
		mine := &op{Key: y.ops[1].Key, Org: x.org, Workflow: x.workflow, Def: def, Variant: def.Variants[0]}
		if a := check("the other's key on an own workflow", mine.request(), 1, 201); a != nil {
			mine.finish(outcome{Final: a, Definitive: true})
			x.runs = append(x.runs, mine.RunID)
			if a.replayed() {
				res.fail(t, "%s using %s's key on its own workflow got a replay", x.org.Name, y.org.Name)
			}
		}
		ops = append(ops, mine)
		// x's own workflow-create key again: x's workflow, not y's.
		if a := check("own create key again", request{Method: "POST", Path: "/api/workflows/", Key: "wf-" + def.Name, Body: def.createBody()}, 0, 201); a != nil {
			var w struct{ ID string }
			if json.Unmarshal(a.Body, &w) != nil || w.ID != x.workflow || !a.replayed() {
				res.fail(t, "%s replaying its create key got workflow %q (replayed %v), want its own %s", x.org.Name, w.ID, a.replayed(), x.workflow)
			}
		}
	}
	verify(t, c, res, ops, expectations{})
	res.Ops = len(ops) + probes
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)
}

// secrets are the identifiers of a tenant no other tenant may ever see.
func (tn *tenant) secrets() []string {
	out := []string{tn.org.ID, tn.org.Token, tn.org.TokenID}
	out = append(out, tn.workflows...)
	for _, r := range tn.runs {
		if r != "" {
			out = append(out, r)
		}
	}
	return out
}

// onlyOwn fails when ids holds an id that is not in own.
func (tn *tenant) onlyOwn(t *testing.T, res *result, what string, ids, own []string) {
	t.Helper()
	for _, id := range ids {
		if !slices.Contains(own, id) {
			res.fail(t, "%s: %s lists %s, which is not its own", tn.org.Name, what, id)
		}
	}
}

// get sends a GET as token, retried like any request.
func get(ctx context.Context, t *testing.T, cl *client, token, path string, replica int) *answer {
	t.Helper()
	out := cl.do(ctx, request{Method: "GET", Path: path, Token: token}, replica)
	if out.Final == nil {
		t.Fatalf("GET %s: no answer", path)
	}
	return out.Final
}

// listIDs are the ids of a list page.
func listIDs(a *answer) []string {
	var page struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(a.Body, &page); err != nil {
		return []string{fmt.Sprintf("(not a list: %s)", clip(a.Body))}
	}
	ids := make([]string, len(page.Data))
	for i, d := range page.Data {
		ids[i] = d.ID
	}
	return ids
}
