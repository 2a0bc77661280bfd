package handlers_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/apitest"
)

// chromiumPath finds a Chromium for the browser test with the project's
// scripts/install-chromium.sh (which installs Debian's chromium when missing
// and running as root, and prints its path). It skips the test, loudly,
// when there is none: a skipped browser test must never pass unnoticed.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	var stderr strings.Builder
	var err error
	if _, statErr := os.Stat("../scripts/install-chromium.sh"); statErr == nil {
		cmd := exec.Command("bash", "../scripts/install-chromium.sh")
		cmd.Stderr = &stderr
		var out []byte
		out, err = cmd.Output()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		path := strings.TrimSpace(lines[len(lines)-1])
		if err == nil && path != "" {
			if _, statErr := os.Stat(path); statErr == nil {
				return path
			}
			err = fmt.Errorf("it printed %q, which does not exist", path)
		}
	} else {
		err = statErr
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if path, lookErr := exec.LookPath(name); lookErr == nil {
				return path
			}
		}
	}
	msg := fmt.Sprintf("\n%s\nSKIPPING %s: no Chromium for the Swagger UI browser test.\n"+
		"scripts/install-chromium.sh failed (%v): %s\n"+
		"Install it (apt-get install chromium) or set CHROMIUM=/path/to/chromium.\n%s",
		strings.Repeat("!", 72), t.Name(), err, strings.TrimSpace(stderr.String()), strings.Repeat("!", 72))
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
	return ""
}

// TestBrowserSwaggerUI drives the real Swagger UI in headless Chromium
// against the real API: authorize with a token, start a run with an
// Idempotency-Key typed into "Try it out", execute it twice, and see the
// second answer replayed (201, idempotent-replayed: true) with one run in
// the database. Then, with the key field empty, as a visitor finds it, two
// executions on two workflows each send a new UUID: both 201.
func TestBrowserSwaggerUI(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test skipped in -short mode")
	}
	chromium := chromiumPath(t)

	e := apitest.New(t)
	srv := e.Server()
	org := e.NewOrg("Browser Co")
	wf := e.NewWorkflow(org, map[string]any{"name": "invoice"})

	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	key := "browser-" + hex.EncodeToString(rnd[:])
	const body = `{"submission":{"customer":"ACME","total":42}}`

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1600),
		// No internet here: nothing may be fetched but the test server.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	tab, cancelTab := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	defer cancelTab()
	// One deadline for the whole flow; a failure then has its own few
	// seconds (on tab) to dump the page.
	ctx, cancel := context.WithTimeout(tab, browserFlowTimeout)
	defer cancel()

	// shot saves a PNG to $ARTIFACTS (a temporary directory without it):
	// of the element sel, or of the whole page when sel is "".
	shot := func(name, sel string) {
		sctx, cancel := context.WithTimeout(tab, 15*time.Second)
		defer cancel()
		var png []byte
		var err error
		if sel == "" {
			png, err = chromedp.Run(sctx, chromedp.FullScreenshot(100)) // 100: PNG
		} else {
			png, err = chromedp.Run(sctx, chromedp.Screenshot(chromedp.CSS(sel)))
		}
		if err != nil {
			t.Logf("screenshot %s: %v", name, err)
			return
		}
		dir := os.Getenv("ARTIFACTS")
		if dir == "" {
			dir = t.TempDir()
		} else if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Logf("screenshot %s: %v", name, err)
			return
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Logf("screenshot %s: %v", name, err)
			return
		}
		t.Logf("screenshot: %s", path)
	}
	screenshot := func(name string) { shot(name, "") }
	fail := func(what string, err error) {
		t.Helper()
		dctx, cancel := context.WithTimeout(tab, 5*time.Second)
		defer cancel()
		html, herr := chromedp.Run(dctx, chromedp.OuterHTML(chromedp.CSS(op), chromedp.AtLeast(0)))
		if herr != nil || html == "" {
			html, _ = chromedp.Run(dctx, chromedp.OuterHTML(chromedp.CSS("body"), chromedp.AtLeast(0)))
		}
		screenshot("swagger-ui-failure.png")
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (the browser flow has %s in all)", err, browserFlowTimeout)
		}
		t.Fatalf("%s: %v\nDOM:\n%.6000s", what, err, html)
	}
	step := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			fail(what, err)
		}
	}

	step("open Swagger UI and wait for the start operation",
		chromedp.Navigate(srv.URL+"/swagger/index.html"),
		chromedp.WaitVisible(chromedp.CSS(op)),
	)
	path, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(op+" .opblock-summary-path")))
	if err != nil {
		fail("read the start operation's path", err)
	}
	require.Equal(t, "/api/workflows/{id}/start/", strings.TrimSpace(strings.ReplaceAll(path, "\u200b", "")))

	// The page shows the OpenAPI 3 document, and opens on a short
	// introduction that links to the rules (docs/api.md) and the problem
	// pages, not on screens of rules.
	front, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](`(() => ({
		url: new URL((document.querySelector(".download-url-input") || {}).value || "", location.href).href,
		stamp: (document.querySelector(".info .version-stamp") || {}).textContent || "",
		intro: (document.querySelector(".info .description") || {}).textContent || "",
		rules: (document.querySelector('.info .description a[href$="/docs/api.md"]') || {}).href || "",
		problems: (document.querySelector('.info .description a[href="/problems/"]') || {}).href || "",
	}))()`))
	if err != nil {
		fail("read the top of the page", err)
	}
	require.True(t, strings.HasSuffix(front["url"], "/swagger/openapi.json"), "the document shown: %q", front["url"])
	require.Contains(t, front["stamp"], "OAS3", "Swagger UI's stamp of an OpenAPI 3 document")
	require.NotEmpty(t, front["rules"], "the introduction links to docs/api.md: %q", front["intro"])
	require.Equal(t, srv.URL+"/problems/", front["problems"], "the introduction links to the problem pages")
	require.Less(t, len(front["intro"]), 1200, "a short introduction: %q", front["intro"])
	shot("swagger-intro.png", ".information-container")

	step("authorize with the token",
		chromedp.Click(chromedp.CSS(".auth-wrapper .btn.authorize")),
		chromedp.WaitVisible(chromedp.CSS(".modal-ux .auth-container input")),
		chromedp.SendKeys(chromedp.CSS(".modal-ux .auth-container input"), "Bearer "+org.Token),
		chromedp.Click(chromedp.CSS(".modal-ux .auth-btn-wrapper .btn.modal-btn.auth.authorize")),
		// Authorized: the dialog now offers Logout.
		chromedp.WaitVisible(chromedp.CSS(".modal-ux .auth-btn-wrapper .btn.modal-btn.auth:not(.authorize)")),
		chromedp.Click(chromedp.CSS(".modal-ux .btn-done")),
		chromedp.WaitNotPresent(chromedp.CSS(".modal-ux")),
	)

	step("expand the operation",
		chromedp.Click(chromedp.CSS(op+" .opblock-summary")),
		chromedp.WaitVisible(chromedp.CSS(op+" .try-out__btn")),
		chromedp.WaitVisible(chromedp.CSS(op+` tr.response[data-code="422"]`)),
	)

	// What the reader sees before trying anything: the parameters, and
	// the examples of the responses, which are the answers TestAPIExamples
	// recorded from the API (not samples made up from the schemas).
	examples := loadExamples(t).Operations["POST /api/workflows/{id}/start/"]
	params, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(op+" .parameters-container")))
	if err != nil {
		fail("read the parameters", err)
	}
	for _, want := range []string{"Idempotency-Key", "A new value per run you mean to start", "Prefer", "RFC 7240", "IDEMPOTENCY_MAX_WAIT"} {
		require.Contains(t, params, want, "the parameters section:\n%s", params)
	}
	step("scroll to the parameters", chromedp.ScrollIntoView(chromedp.CSS(op+" .parameters-container")))
	shot("swagger-start-parameters.png", op+" .parameters-container")
	for _, code := range []string{"201", "400", "409", "422"} {
		row := op + ` tr.response[data-code="` + code + `"]`
		rendered, err := chromedp.Run(ctx, chromedp.Evaluate[exampleShown](renderedExampleJS(row)))
		if err != nil {
			fail("read the example of "+code, err)
		}
		want := examples.Responses[code]
		require.NotNil(t, want, "examples.json has no %s of the start", code)
		require.JSONEq(t, string(want.Body), rendered.Example, "the %s example Swagger UI shows is the recorded answer", code)
		require.Contains(t, rendered.Description, "Example: "+strings.ReplaceAll(want.Situation, "`", ""),
			"the %s description says what the example answered", code)
		step("scroll to the "+code+" example", chromedp.ScrollIntoView(chromedp.CSS(row)))
		shot("swagger-start-"+code+".png", row)
	}
	// The texts a reader looks for, in the example as shown.
	for code, want := range map[string][]string{
		"201": {`"status": "queued"`, `"customer": "ACME"`},
		"400": {`"code": "validation_error"`, `"field": "Submission"`},
		"409": {`"code": "idempotency_key_in_progress"`, "A request with this idempotency key is currently being processed."},
		"422": {`"code": "idempotency_key_reused"`, "Idempotency key has already been used with a different request body."},
	} {
		rendered, err := chromedp.Run(ctx, chromedp.Evaluate[exampleShown](renderedExampleJS(op+` tr.response[data-code="`+code+`"]`)))
		if err != nil {
			fail("read the example of "+code, err)
		}
		for _, w := range want {
			require.Contains(t, rendered.Example, w, "the %s example as shown", code)
		}
		if code == "201" {
			for _, absent := range []string{"findings", "finished_at", `"error"`} {
				require.NotContains(t, rendered.Example, absent, "the 201 example is a queued run")
			}
		}
	}

	step("try it out",
		chromedp.Click(chromedp.CSS(op+" .try-out__btn")),
		chromedp.WaitVisible(chromedp.CSS(op+` tr[data-param-name="id"] input`)),
		chromedp.WaitVisible(chromedp.CSS(op+` input[placeholder="Idempotency-Key"]`)),
		chromedp.WaitVisible(chromedp.CSS(op+" textarea.body-param__text")),
	)
	// Try it out starts from the examples: the key, the preference and the body.
	filled, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](`(() => ({
		key: document.querySelector(`+jsString(op+` input[placeholder="Idempotency-Key"]`)+`).value,
		prefer: document.querySelector(`+jsString(op+` input[placeholder="Prefer"]`)+`).value,
		body: document.querySelector(`+jsString(op+" textarea.body-param__text")+`).value,
	}))()`))
	if err != nil {
		fail("read the filled-in request", err)
	}
	require.Empty(t, filled["key"], "no fixed key is filled in: every visitor would share it")
	require.Equal(t, examples.Request.Headers["Prefer"], filled["prefer"])
	require.JSONEq(t, string(examples.Request.Body), filled["body"])

	step("fill in the workflow, a key of this test and the body",
		chromedp.SendKeys(chromedp.CSS(op+` tr[data-param-name="id"] input`), wf),
		// Replace the filled-in values so that React sees them.
		chromedp.Evaluate[chromedp.Void](setReactValue(op+` input[placeholder="Idempotency-Key"]`, key)),
		chromedp.Evaluate[chromedp.Void](setReactValue(op+" textarea.body-param__text", body)),
	)

	type shown struct {
		Status string `json:"status"`
		Text   string `json:"text"`
	}
	var last shown
	execute := func(n int) shown {
		t.Helper()
		step(fmt.Sprintf("click Execute (#%d)", n), chromedp.Click(chromedp.CSS(op+" .btn.execute")))
		// The live response is new when its text (which holds the
		// response's own x-request-id) differs from the last one's.
		got, err := chromedp.Run(ctx, chromedp.Poll[shown](liveResponseJS(op, last.Text),
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(0)))
		if err != nil {
			fail(fmt.Sprintf("read the response of Execute #%d", n), err)
		}
		t.Logf("Execute #%d: status %s", n, got.Status)
		last = got
		return got
	}

	first := execute(1)
	require.Equal(t, "201", first.Status, "first Execute; response section:\n%s", first.Text)
	require.NotContains(t, strings.ToLower(first.Text), "idempotent-replayed")

	second := execute(2)
	require.Equal(t, "201", second.Status, "second Execute; response section:\n%s", second.Text)
	lower := strings.ToLower(second.Text)
	require.Contains(t, lower, "idempotent-replayed: true", "the second answer is a replay; response section:\n%s", second.Text)
	require.Contains(t, lower, "original-request-id:")
	require.EqualValues(t, 1, e.Count("validation_runs", "workflow_id = ?", wf), "two Executes with one key make one run")

	// The key field left empty: each Execute sends a new key (the page's
	// request interceptor), so two executions on two workflows are two
	// runs, both 201, neither a replay nor a 422, as two visitors' are.
	wf2 := e.NewWorkflow(org, map[string]any{"name": "invoice 2"})
	step("empty the key field",
		chromedp.Evaluate[chromedp.Void](setReactValue(op+` input[placeholder="Idempotency-Key"]`, "")),
	)
	for i, w := range []string{wf, wf2} {
		step(fmt.Sprintf("fill in workflow %d", i+1),
			chromedp.Evaluate[chromedp.Void](setReactValue(op+` tr[data-param-name="id"] input`, w)))
		got := execute(3 + i)
		require.Equal(t, "201", got.Status, "Execute with an empty key on workflow %d; response section:\n%s", i+1, got.Text)
		require.NotContains(t, strings.ToLower(got.Text), "idempotent-replayed", "a new key, not a replay")
	}
	var fresh []string
	require.NoError(t, e.DB.Raw(`SELECT key FROM idempotency_keys WHERE org_id = ? AND key <> ? ORDER BY created_at`, org.ID, key).Scan(&fresh).Error)
	require.Len(t, fresh, 2, "each Execute with an empty field sent a key of its own")
	require.NotEqual(t, fresh[0], fresh[1], "two executions never share a key")
	for _, k := range fresh {
		u, err := uuid.Parse(k)
		require.NoError(t, err, "the key sent is a UUID: %q", k)
		require.EqualValues(t, 4, u.Version(), "a random (v4) UUID: %q", k)
	}
	require.EqualValues(t, 2, e.Count("validation_runs", "workflow_id = ?", wf), "the replayed start and the fresh one")
	require.EqualValues(t, 1, e.Count("validation_runs", "workflow_id = ?", wf2))
	t.Logf("keys sent by Swagger UI for empty fields: %v", fresh)

	// Everything the page loaded came from the server under test (no CDN).
	loaded, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`[location.href, ...performance.getEntriesByType("resource").map(r => r.name)]`))
	if err != nil {
		fail("list the page's resources", err)
	}
	for _, u := range loaded {
		require.True(t, strings.HasPrefix(u, srv.URL+"/"), "the page loaded %s from elsewhere", u)
	}

	require.EqualValues(t, 1, e.Count("idempotency_keys", "key = ?", key))

	step("scroll to the response", chromedp.ScrollIntoView(chromedp.CSS(op+" .live-responses-table")))
	screenshot("swagger-ui-replayed.png")
}

// op is the Swagger UI block of POST /api/workflows/{id}/start/ (tag runs,
// operationId startRun).
const op = "#operations-runs-startRun"

func jsString(s string) string {
	return "`" + strings.NewReplacer("\\", "\\\\", "`", "\\`", "$", "\\$").Replace(s) + "`"
}

// liveResponseJS is a poll predicate: the status and text of the
// operation's live response once it is there and is not prev.
func liveResponseJS(selector, prev string) string {
	return `(() => {
		const table = document.querySelector(` + jsString(selector+" .live-responses-table") + `);
		if (!table) return false;
		const text = table.innerText;
		if (!/x-request-id/i.test(text) || text === ` + jsString(prev) + `) return false;
		const status = table.querySelector(".response .response-col_status");
		return { status: status ? status.innerText.trim() : "", text: text };
	})()`
}

// setReactValue sets an input's or a textarea's value through the native
// setter and fires input, so React's onChange sees it (assigning .value
// alone is undone). It focuses the element first and leaves it after: the
// parameter inputs debounce their changes, and pass them on at once when
// they lose the focus.
func setReactValue(selector, value string) string {
	return `(() => {
		const el = document.querySelector(` + jsString(selector) + `);
		el.focus();
		const set = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(el), "value").set;
		set.call(el, ` + jsString(value) + `);
		el.dispatchEvent(new Event("input", { bubbles: true }));
		el.dispatchEvent(new Event("change", { bubbles: true }));
		el.blur();
		return el.value;
	})()`
}

// exampleShown is a response row of Swagger UI: its description and the
// text of its example.
type exampleShown struct {
	Description string `json:"description"`
	Example     string `json:"example"`
}

// renderedExampleJS reads the description and the example value of the
// response row row.
func renderedExampleJS(row string) string {
	return `(() => {
		const row = document.querySelector(` + jsString(row) + `);
		const desc = row.querySelector(".response-col_description__inner");
		const ex = row.querySelector(".highlight-code");
		return { description: desc ? desc.innerText : "", example: ex ? ex.innerText : "" };
	})()`
}

// browserFlowTimeout bounds the whole browser flow: generous, since
// Chromium beside a loaded make test (two cores, load average 20) took most
// of a minute for it.
const browserFlowTimeout = 3 * time.Minute
