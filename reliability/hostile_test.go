package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valruns/valruns/models"
)

// probe is one hostile request. Every answer to one must be a 4xx problem
// document with a code: never a 5xx, never a huge body.
type probe struct {
	cat          string // the kind of hostility, for the report
	name         string
	method, path string
	auth         *string // the Authorization header; nil sends the organisation's token
	keys         []string
	body         []byte
	chunked      bool // send the body without Content-Length
	// storeNothing: rejected before the handler (malformed or empty JSON, a
	// number PostgreSQL cannot store, 401, 413), so no key row may exist.
	storeNothing bool
}

func str(s string) *string { return &s }

// hostileInput sends a corpus of a few hundred hostile requests (bodies,
// numbers, keys, tokens, routes, methods, sizes, rules) and checks every
// answer, that /metrics does not grow with invented methods, that rejected
// requests stored nothing, and that rules past a limit are refused at
// create time or make runs that end in error.
func hostileInput(t *testing.T, s *suite, res *result) {
	c, cl, rec, o := setup(t, s, "hostile")
	def := orderWorkflow()
	wf := createWorkflow(t, cl, o, def)
	revoked := revokedToken(t, c, cl, o, res)
	ctx := context.Background()

	probes := corpus(wf, o.Token, revoked)
	mustNotStore := map[string]string{} // key -> probe
	accepted := map[string]bool{}       // runs of probes wrongly accepted: reported as answers, not again as strays
	wrong := map[string][]string{}      // category -> what went wrong
	total := map[string]int{}
	var cats []string
	for i, p := range probes {
		if total[p.cat] == 0 {
			cats = append(cats, p.cat)
		}
		total[p.cat]++
		if a := sendProbe(ctx, cl, p, i%len(c.servers)); a != nil {
			if msg := hostileAnswerProblem(p, a); msg != "" {
				t.Log(msg)
				wrong[p.cat] = append(wrong[p.cat], msg)
			}
			// From Location: an amplified body may have been cut.
			if id, ok := strings.CutPrefix(a.Header.Get("Location"), "/api/runs/"); ok && a.Status == 201 {
				accepted[strings.TrimSuffix(id, "/")] = true
			}
		} else {
			wrong[p.cat] = append(wrong[p.cat], "probe "+p.name+": no answer after retries")
		}
		if p.storeNothing {
			for _, k := range p.keys {
				mustNotStore[k] = p.name
			}
		}
	}
	for _, cat := range cats {
		if w := wrong[cat]; len(w) > 0 {
			res.fail(t, "%s: %d of %d probes answered wrongly, such as %s", cat, len(w), total[cat], w[0])
		}
	}
	if stored := storedKeys(c, slices.Collect(maps.Keys(mustNotStore))); len(stored) > 0 {
		var names []string
		for _, k := range stored {
			names = append(names, mustNotStore[k])
		}
		slices.Sort(names)
		res.fail(t, "%d requests rejected before the handler (the contract: nothing stored) stored their key: %s",
			len(stored), strings.Join(names[:min(len(names), 4)], "; "))
	}

	// Invented methods must not grow /metrics without bound (a label taken
	// from the raw method would add series for each).
	api := c.servers[0].url
	_ = metricsSize(t, cl, api) // the first scrape creates its own series
	before := metricsSize(t, cl, api)
	const methods = 200
	for i := range methods {
		p := probe{name: fmt.Sprintf("invented method FUZZ%03d", i), method: fmt.Sprintf("FUZZ%03d", i),
			path: []string{"/api/workflows/", "/api/runs/", "/nope", "/healthz"}[i%4]}
		a := sendProbe(ctx, cl, p, 0)
		switch {
		case a == nil:
			res.fail(t, "probe %s: no answer", p.name)
		case hostileAnswerProblem(p, a) != "":
			res.fail(t, "%s", hostileAnswerProblem(p, a))
		}
	}
	after := metricsSize(t, cl, api)
	t.Logf("/metrics: %d bytes before %d invented methods, %d after", before, methods, after)
	if after-before > 16<<10 {
		res.fail(t, "/metrics grew from %d to %d bytes after %d requests with invented methods: a label takes raw request values", before, after, methods)
	}

	// Rules past a limit: refused at create time, or accepted and their runs
	// end in error; never a 5xx, never a stuck worker.
	errorRuns := map[string]string{}
	for i, r := range hostileRules() {
		key := fmt.Sprintf("hostile-rule-%d", i)
		out := cl.do(ctx, request{Method: "POST", Path: "/api/workflows/", Key: key, Body: r.create, Token: o.Token}, i)
		switch {
		case !out.Definitive:
			res.fail(t, "rule %s: creating the workflow got no definitive answer: %s", r.name, lastOf(out))
			continue
		case out.Final.Status == 400 && out.Final.isProblem() && out.Final.code() != "":
			t.Logf("rule %s: refused at create time (%s)", r.name, out.Final.code())
			continue
		case out.Final.Status != 201:
			res.fail(t, "rule %s: create answered %d %s, want 400 or 201", r.name, out.Final.Status, clip(out.Final.Body))
			continue
		}
		var w struct{ ID string }
		_ = json.Unmarshal(out.Final.Body, &w)
		start := cl.do(ctx, request{Method: "POST", Path: "/api/workflows/" + w.ID + "/start/", Key: key,
			Body: `{"submission":` + r.submission + `}`, Token: o.Token}, i)
		var run struct{ ID string }
		if !start.Definitive || start.Final.Status != 201 || json.Unmarshal(start.Final.Body, &run) != nil || run.ID == "" {
			res.fail(t, "rule %s: start answered %s, want 201", r.name, lastOf(start))
			continue
		}
		t.Logf("rule %s: accepted; its run %s must end in error", r.name, run.ID)
		errorRuns[run.ID] = r.name
	}
	if len(errorRuns) == 0 {
		res.fail(t, "every hostile rule was refused at create time: the limits of a run went untested; "+
			"add a rule that the static estimate lets through (the CEL estimate grew sharper with cel.dev/cel-go v0.32)")
	}

	verify(t, c, res, nil, expectations{errorRuns: errorRuns, foreignRuns: accepted})
	res.Ops = len(probes) + methods + len(hostileRules())
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)
}

// hostileAnswerProblem says what is wrong with an answer to a probe ("" if
// nothing): it must be a 4xx problem document with a code and a matching
// status, and a body of reasonable size.
func hostileAnswerProblem(p probe, a *answer) string {
	var doc struct {
		Status int    `json:"status"`
		Code   string `json:"code"`
	}
	switch {
	case a.Oversized:
		return fmt.Sprintf("probe %s: answered %d with a body over %d bytes (size amplification)", p.name, a.Status, len(a.Body))
	case a.Status < 400 || a.Status > 499:
		return fmt.Sprintf("probe %s: answered %d, want a 4xx: %s", p.name, a.Status, clip(a.Body))
	case !a.isProblem():
		return fmt.Sprintf("probe %s: answered %d with Content-Type %q, want application/problem+json", p.name, a.Status, a.Header.Get("Content-Type"))
	case json.Unmarshal(a.Body, &doc) != nil || doc.Code == "" || doc.Status != a.Status:
		return fmt.Sprintf("probe %s: answered %d with a problem document without a code or with another status: %s", p.name, a.Status, clip(a.Body))
	}
	return ""
}

// sendProbe sends p once to a replica, retrying only when no answer came
// back at all (an early 413 can race with the upload).
func sendProbe(ctx context.Context, cl *client, p probe, replica int) *answer {
	for range 3 {
		var body io.Reader
		if p.body != nil {
			body = bytes.NewReader(p.body)
			if p.chunked {
				body = io.MultiReader(body) // hides the length: Transfer-Encoding: chunked
			}
		}
		hr, err := http.NewRequestWithContext(ctx, p.method, cl.bases[replica]+p.path, body)
		if err != nil {
			return nil
		}
		if p.body != nil {
			hr.Header.Set("Content-Type", "application/json")
		}
		if p.auth != nil {
			if *p.auth != "" {
				hr.Header.Set("Authorization", *p.auth)
			}
		}
		for _, k := range p.keys {
			hr.Header.Add("Idempotency-Key", k)
		}
		a, err := cl.send(hr)
		at := attempt{At: time.Now(), Replica: replica}
		if err != nil {
			at.Err = err.Error()
			cl.rec.observe(p.path, at)
			continue
		}
		at.Status, at.RetryAfter, at.Problem, at.Code = a.Status, a.Header.Get("Retry-After"), a.isProblem(), a.code()
		cl.rec.observe(p.path, at)
		return a
	}
	return nil
}

// withToken sets p's Authorization to the organisation's token.
func withToken(token string, ps ...probe) []probe {
	for i := range ps {
		if ps[i].auth == nil {
			ps[i].auth = str("Bearer " + token)
		}
	}
	return ps
}

// corpus is the hostile requests. Keys are unique per probe.
func corpus(wf, token, revoked string) []probe {
	start := "/api/workflows/" + wf + "/start/"
	var ps []probe
	n := 0
	key := func() []string { n++; return []string{fmt.Sprintf("hostile-%04d", n)} }
	cat := ""
	add := func(p probe) { p.cat = cat; ps = append(ps, withToken(token, p)...) }

	cat = "malformed JSON"
	malformed := []string{`{`, `{"submission":`, `{"submission":1,}`, `{'submission':1}`, `{"submission":tru}`,
		`{"submission":1}}`, `{"submission":1} x`, `[`, `NaN`, `{"submission":NaN}`, `{"submission":Infinity}`,
		`{"submission":-}`, `{"submission":01}`, `{"submission":"\x"}`, "{\"submission\":\"\xff\xfe\"}",
		`{"submission":"\ud800"}`, "{\"submission\":\"a\tb\"}", "\xef\xbb\xbf{\"submission\":1}", `{"submission":1e}`,
		`{"submission":.5}`, `{"submission":+1}`, `{"submission":0x10}`, "{\"submission\":\"a\x00b\"}",
		strings.Repeat("[", 100_000), `{"submission":1} {}`, `{"submission":1,"submission":2}`,
		`{"submission":{"a":1,"a":2}}`, `{"submission":1,"metadata":{"k":1,"k":2}}`}
	for i, b := range malformed {
		name := fmt.Sprintf("malformed body #%d %s", i, label(b))
		add(probe{name: name + " (start, key)", method: "POST", path: start, keys: key(), body: []byte(b), storeNothing: true})
		add(probe{name: name + " (start)", method: "POST", path: start, body: []byte(b)})
		add(probe{name: name + " (create, key)", method: "POST", path: "/api/workflows/", keys: key(), body: []byte(b), storeNothing: true})
	}
	cat = "empty bodies"
	for i, b := range []string{"", " ", "\n\t "} {
		add(probe{name: fmt.Sprintf("empty body #%d (start, key)", i), method: "POST", path: start, keys: key(), body: []byte(b), storeNothing: true})
		add(probe{name: fmt.Sprintf("empty body #%d (create, key)", i), method: "POST", path: "/api/workflows/", keys: key(), body: []byte(b), storeNothing: true})
	}
	cat = "bodies that are not the start object"
	for _, b := range []string{`[]`, `[1,2]`, `"x"`, `42`, `true`, `null`, `{}`, `{"metadata":{}}`,
		`{"submission":1,"metadata":[1]}`, `{"submission":1,"metadata":"x"}`, `{"submission":1,"metadata":1}`,
		`{"submission":1,"metadata":true}`, `{"submission":1,"SUBMISSION":2}`, `{"submission":1,"submision":2}`,
		`{"submission":"a\u0000b"}`, `{"submission":1,"metadata":{"a\u0000":1}}`,
		`{"submission":1,"Metadata":{"a":1},"metadata":{"b":2}}`} {
		add(probe{name: "not the start object " + label(b), method: "POST", path: start, keys: key(), body: []byte(b)})
	}

	cat = "numbers PostgreSQL cannot store"
	// Numbers PostgreSQL cannot store (numeric: 131072 digits before the
	// point, 16383 after), or whose exponent does not even fit an int64.
	for _, num := range []string{`1e1000000`, `-1e1000000`, `1e-1000000`, `-1e-1000000`, `1e99999999999999999999`, `123456789e2147483647`} {
		for _, b := range []string{`{"submission":` + num + `}`, `{"submission":[1,{"x":` + num + `}]}`, `{"submission":1,"metadata":{"x":` + num + `}}`} {
			add(probe{name: "unstorable number " + b, method: "POST", path: start, keys: key(), body: []byte(b), storeNothing: true})
		}
	}
	for _, kw := range []string{`"minimum":1e1000000`, `"maximum":-1e1000000`, `"multipleOf":1e-1000000`, `"exclusiveMinimum":1e-1000000`,
		`"const":1e1000000`, `"enum":[1e1000000]`, `"default":1e1000000`, `"examples":[1e-1000000]`} {
		b := `{"name":"n","schema":{"type":"number",` + kw + `}}`
		add(probe{name: "unstorable number in schema " + kw, method: "POST", path: "/api/workflows/", keys: key(), body: []byte(b), storeNothing: true})
	}

	cat = "size amplification"
	// Size amplification: ~1 KB of input whose stored form is 131072 digits per number.
	big := strings.TrimSuffix(strings.Repeat("1e131071,", 100), ",")
	var members []string
	for i := range 60 {
		members = append(members, fmt.Sprintf(`"m%d":1e131071`, i))
	}
	obj := strings.Join(members, ",")
	add(probe{name: "amplification: submission of 100 × 1e131071", method: "POST", path: start, keys: key(), body: []byte(`{"submission":[` + big + `]}`)})
	add(probe{name: "amplification: metadata of 60 × 1e131071", method: "POST", path: start, keys: key(), body: []byte(`{"submission":1,"metadata":{` + obj + `}}`)})
	add(probe{name: "amplification: schema const of 100 × 1e131071", method: "POST", path: "/api/workflows/", keys: key(),
		body: []byte(`{"name":"amp","schema":{"const":[` + big + `]}}`)})

	cat = "bad Idempotency-Keys"
	// Idempotency-Keys that are not 1-255 printable ASCII characters.
	good := []byte(`{"submission":{"customer":"ACME","total":1}}`)
	for _, k := range [][]string{{""}, {strings.Repeat("a", 256)}, {strings.Repeat("k", 4000)}, {"ключ-1"}, {"é"},
		{`"unterminated`}, {`""`}, {`"a"b`}, {"a\tb"}, {"k1", "k2"}, {"\x80\xff"}} {
		add(probe{name: "bad Idempotency-Key " + label(strings.Join(k, ",")),
			method: "POST", path: start, keys: k, body: good})
	}

	cat = "bad tokens"
	// Missing, malformed, unknown and revoked tokens.
	for _, auth := range []string{"", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer vr_unknown0000000000", "Bearer not-a-token",
		"Bearer vr_" + strings.Repeat("x", 8000), "Bearer " + revoked, "Bearer " + token + "x", "Token " + token,
		"Bearer vr_\xc3\xa9", "Bearer " + token + " extra", "Bearer " + strings.ToUpper(token)} {
		add(probe{name: "token " + label(auth) + " (start, key)", method: "POST", path: start, auth: str(auth), keys: key(), body: good, storeNothing: true})
		add(probe{name: "token " + label(auth) + " (list)", method: "GET", path: "/api/workflows/", auth: str(auth)})
	}

	cat = "unknown routes, wrong methods, bad ids and parameters"
	// Unknown routes, wrong methods, bad ids and bad query parameters.
	for _, r := range [][2]string{{"GET", "/api/nope"}, {"GET", "/api/workflows/" + wf + "/nope"}, {"POST", "/api/runs/"},
		{"DELETE", "/api/workflows/" + wf + "/"}, {"PUT", "/api/runs/" + wf + "/"}, {"PATCH", "/api/workflows/"},
		{"OPTIONS", "/api/workflows/"}, {"GET", "/nope"}, {"GET", "/api//workflows"}, {"GET", "/%2e%2e/%2e%2e/etc/passwd"},
		{"GET", "/api/workflows/" + strings.Repeat("a", 4000)}, {"GET", "/api/runs/not-a-uuid"},
		{"GET", "/api/runs/00000000-0000-0000-0000-000000000000/"}, {"GET", "/api/workflows/" + strings.ToUpper(wf) + "x/"},
		{"GET", "/api/runs/?limit=0"}, {"GET", "/api/runs/?limit=101"}, {"GET", "/api/runs/?limit=-1"}, {"GET", "/api/runs/?limit=abc"},
		{"GET", "/api/runs/?limit=1e3"}, {"GET", "/api/runs/?cursor=garbage"}, {"GET", "/api/runs/?cursor=" + strings.Repeat("A", 10000)},
		{"GET", "/api/runs/?workflow_id=nope"}, {"GET", "/api/workflows/?limit=0"}, {"GET", "/api/workflows/?cursor=!!!!"},
		{"GET", "/api/workflows/?cursor=MjAyNi0xMS0yMlQwMjo0MDo"}} {
		add(probe{name: "route " + r[0] + " " + label(r[1]), method: r[0], path: r[1]})
	}
	add(probe{name: "start on a workflow that is not a UUID", method: "POST", path: "/api/workflows/not-a-uuid/start/", keys: key(), body: good})
	add(probe{name: "start on an unknown workflow", method: "POST", path: "/api/workflows/00000000-0000-0000-0000-000000000000/start/", keys: key(), body: good})

	cat = "invalid workflows"
	// Workflows that do not compile or make no sense.
	for _, b := range []string{`{}`, `{"name":""}`, `{"name":"` + strings.Repeat("n", 201) + `"}`, `{"name":"x","assertions":{}}`,
		`{"name":"x","assertions":[{"name":"a","expr":"1"}]}`, `{"name":"x","assertions":[{"name":"a","expr":"nope"}]}`,
		`{"name":"x","assertions":[{"name":"a","expr":"true","severity":"fatal"}]}`,
		`{"name":"x","assertions":[{"name":"a","expr":"true"},{"name":"a","expr":"true"}]}`,
		`{"name":"x","assertions":[{"name":"","expr":"true"}]}`, `{"name":"x","schema":{"$ref":"http://example.com/s.json"}}`,
		`{"name":"x","schema":{"type":"nonsense"}}`, `{"name":"x","schema":1}`, `{"name":"x","schema":{"$ref":"#/$defs/missing"}}`,
		`{"name":"x","schema":{"pattern":"("}}`, `{"name":"x","assertions":[{"name":"a","expr":"submission.x ==="}]}`} {
		add(probe{name: "invalid workflow " + label(b), method: "POST", path: "/api/workflows/", keys: key(), body: []byte(b)})
	}

	cat = "10 MB bodies"
	// 10 MB bodies, with and without Content-Length: 413.
	huge := []byte(`{"submission":"` + strings.Repeat("a", 10<<20) + `"}`)
	for _, chunked := range []bool{false, true} {
		add(probe{name: fmt.Sprintf("10 MB body (start, chunked %v)", chunked), method: "POST", path: start, keys: key(), body: huge, chunked: chunked, storeNothing: true})
		add(probe{name: fmt.Sprintf("10 MB body (create, chunked %v)", chunked), method: "POST", path: "/api/workflows/", keys: key(), body: huge, chunked: chunked, storeNothing: true})
	}
	return ps
}

// hostileRule is a workflow whose rules cannot run within any sane limit,
// and a submission that makes them run.
type hostileRule struct {
	name, create, submission string
}

func hostileRules() []hostileRule {
	// 40 nested allOf, each referencing the next twice: 2^40 validations.
	defs := []string{}
	for i := range 40 {
		defs = append(defs, fmt.Sprintf(`"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i+1, i+1))
	}
	defs = append(defs, `"d40":{"type":"string","minLength":1}`)
	fanout := `{"name":"ref-fanout","schema":{"$defs":{` + strings.Join(defs, ",") + `},"$ref":"#/$defs/d0"}}`

	rule := func(name, expr string) string {
		b, _ := json.Marshal(map[string]any{"name": name, "assertions": []map[string]string{{"name": "r", "expr": expr}}})
		return string(b)
	}
	// A string that doubles at each of 28 nested comprehensions: 2 bytes
	// become 512 MB (kept at 28 levels so a worker without a memory limit
	// does not take the shared machine's memory with it). Refused at create
	// time since cel.dev/cel-go v0.32, whose estimate follows the doubling;
	// accepted, and stopped by the run, before.
	doubling := "size(s28) > 0"
	for i := 27; i >= 0; i-- {
		doubling = fmt.Sprintf("[s%d + s%d].all(s%d, %s)", i, i, i+1, doubling)
	}
	doubling = "[submission.s].all(s0, " + doubling + ")"
	return []hostileRule{
		{"schema $ref fan-out (40 nested allOf)", fanout, `"x"`},
		{"CEL string doubling (28 levels)", rule("doubling", doubling), `{"s":"ab"}`},
		{"CEL comprehension bomb", rule("bomb", "lists.range(10000).map(a, lists.range(10000).map(b, a * b)).size() > 0"), `{"s":"ab"}`},
		{"CEL expression of 120 000 characters", rule("huge", strings.Repeat("submission.s != 'x' && ", 5000)+"true"), `{"s":"ab"}`},
		{"CEL expression nested 2000 deep", rule("deep", strings.Repeat("(", 2000)+"true"+strings.Repeat(")", 2000)), `{"s":"ab"}`},
		// Within the static estimate, past the limits of a run: a 64 KB string
		// joined 1,024 times (64 MB, past MaxValueSize), and 9 million steps of
		// nested loops (past CostLimit).
		{"CEL join of a 64 KB string 1,024 times", rule("join", "[[\"a\"]"+strings.Repeat(".map(s, s + s)", 16)+"]"+
			strings.Repeat(".map(l, l + l)", 10)+`[0].join("") == ""`), `{"s":"ab"}`},
		{"CEL nested loops of 9 million steps", rule("loops", "lists.range(3000).all(i, lists.range(3000).all(j, j >= 0))"), `{"s":"ab"}`},
	}
}

// revokedToken makes a second token of o, uses it on every replica (so
// their caches hold it), revokes it and waits until every replica refuses
// it, which AUTH_CACHE_TTL bounds.
func revokedToken(t *testing.T, c *cluster, cl *client, o org, res *result) string {
	t.Helper()
	ctx := context.Background()
	store := models.NewTokenStore(c.gdb)
	tok, row, err := store.Create(ctx, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.servers {
		if a := sendProbe(ctx, cl, probe{method: "GET", path: "/api/workflows/", auth: str("Bearer " + tok)}, i); a == nil || a.Status != 200 {
			t.Fatalf("the new token does not work on replica %d", i)
		}
	}
	if err := store.Revoke(ctx, row.ID); err != nil {
		t.Fatal(err)
	}
	bound := c.s.cfg.AuthCacheTTL + 10*time.Second
	for i := range c.servers {
		if !waitUntil(bound, func() bool {
			a := sendProbe(ctx, cl, probe{method: "GET", path: "/api/workflows/", auth: str("Bearer " + tok)}, i)
			return a != nil && a.Status == 401
		}) {
			res.fail(t, "replica %d still accepts a revoked token %s after its revocation", i, bound)
		}
	}
	return tok
}

// storedKeys returns which of keys have a row in idempotency_keys.
func storedKeys(c *cluster, keys []string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := c.db.QueryContext(ctx, `SELECT key FROM idempotency_keys WHERE key = ANY($1)`, keys)
	if err != nil {
		return []string{"query failed: " + err.Error()}
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		if rows.Scan(&k) == nil {
			out = append(out, k)
		}
	}
	return out
}

// metricsSize is the size of a replica's /metrics.
func metricsSize(t *testing.T, cl *client, base string) int {
	t.Helper()
	resp, err := cl.hc.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	n, _ := io.Copy(io.Discard, resp.Body)
	return int(n)
}

// label is a short quoted form of s for probe names.
func label(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q... (%d bytes)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}
