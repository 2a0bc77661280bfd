package handlers_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/config"
	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/idempotency"
	"github.com/valruns/valruns/internal/apispec"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
	"github.com/valruns/valruns/validate"
)

var updateExamples = flag.Bool("update-examples", false,
	"TestAPIExamples: write the answers recorded now to internal/apispec/examples.json (make docs does)")

// examplesFile holds the examples of the spec (package apispec).
const examplesFile = "../" + apispec.DefaultFile

// The values the recorded answers are written with: ids and keys of the
// examples (real ones are new at every recording), and the instant the
// first thing recorded happened.
const (
	exWorkflowID  = "0b7d3c1e-8a2f-4c55-9a51-0d6f3f1c2b7a"
	exRunID       = "5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a"
	exFailedRunID = "9d4b7a2e-1c3f-4e8d-b6a5-7f0e2d9c1b34"
	// exMissingID is an id nothing has.
	exMissingID  = "3f9a1c7e-5b2d-4f8a-9e6c-1d0b7a4e2c58"
	exCreateKey  = "d8f2a9c4-6e1b-4b7a-8c3d-5f0e9a2b7c16"
	exStartKey   = "4c6f0a8e-2d1b-4e9c-a7f3-6b5d8e0c2a91"
	exHookID     = "7c1e2d3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f"
	exGoneHookID = "e1d2c3b4-a5f6-4e7d-8c9b-0a1f2e3d4c5b"
	exHookKey    = "a2b3c4d5-e6f7-4a8b-9c0d-1e2f3a4b5c6d"
	exRotateKey  = "3c2b1a09-8f7e-4d6c-9b5a-4e3d2c1b0a9f"
	exResendKey  = "5e4d3c2b-1a09-4f8e-8d7c-6b5a4f3e2d1c"
	exTestKey    = "9b8a7f6e-5d4c-4b3a-9291-8f7e6d5c4b3a"
	// exTestDeliveryID and exTestEventID are how a test event's delivery
	// and event id (evt_ + its hex) are written.
	exTestDeliveryID = "c4d5e6f7-a8b9-4c0d-9e1f-2a3b4c5d6e7f"
	exTestEventID    = "0f1e2d3c-4b5a-4697-8877-665544332211"
	// exSecret is how a recorded signing secret is written (a real one is
	// new at every recording).
	exSecret     = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYq="
	exPrefer     = "wait=5"
	exDemoQuota  = 1000
	exSmallQuota = 100
)

// exDeliveryIDs are how the deliveries of the example's two runs are written.
var exDeliveryIDs = []string{"2d3e4f5a-6b7c-4d8e-9f0a-1b2c3d4e5f6a", "8a9b0c1d-2e3f-4a5b-8c6d-7e8f9a0b1c2d"}

var exBase = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// The requests of the success examples: the demo workflow of `make run`
// (demo.go; TestAPIExamplesAreTheDemo in package main checks they agree)
// and a submission it passes.
const (
	exWorkflowBody = `{"name":"demo invoice","schema":{"type":"object","required":["customer","total"],` +
		`"properties":{"customer":{"type":"string","minLength":1},"total":{"type":"number"}}},"assertions":[` +
		`{"name":"positive_total","expr":"submission.total > 0","severity":"error","message":"total must be positive"},` +
		`{"name":"large_total","expr":"submission.total < 10000","severity":"warning","message":"total is unusually large"}]}`
	exStartBody = `{"submission":{"customer":"ACME","total":42}}`
)

// The operations, as the spec names them.
const (
	opIndex       = "GET /"
	opHealthz     = "GET /healthz"
	opReadyz      = "GET /readyz"
	opMetrics     = "GET /metrics"
	opProblems    = "GET /problems/"
	opProblem     = "GET /problems/{code}"
	opCreateWF    = "POST /api/workflows/"
	opListWF      = "GET /api/workflows/"
	opGetWF       = "GET /api/workflows/{id}/"
	opStart       = "POST /api/workflows/{id}/start/"
	opListRuns    = "GET /api/runs/"
	opGetRun      = "GET /api/runs/{id}/"
	opUsage       = "GET /api/usage"
	opKey         = "GET /api/idempotency-keys/{scope}/{key}"
	opCreateHook  = "POST /api/webhook-endpoints/"
	opListHooks   = "GET /api/webhook-endpoints/"
	opGetHook     = "GET /api/webhook-endpoints/{id}/"
	opDeleteHook  = "DELETE /api/webhook-endpoints/{id}/"
	opRotateHook  = "POST /api/webhook-endpoints/{id}/rotate-secret/"
	opDeliveries  = "GET /api/webhook-endpoints/{id}/deliveries/"
	opRedeliver   = "POST /api/webhook-endpoints/{id}/deliveries/{delivery_id}/redeliver/"
	opTestHook    = "POST /api/webhook-endpoints/{id}/test/"
	exHookBody    = `{"url":"https://example.com/valruns-hooks","description":"invoices service","events":["validation_run.finished"]}`
	exStartKeyURL = "/api/idempotency-keys/workflow_start/" + exStartKey
)

// TestAPIExamples sends every situation the spec documents to the real
// router on real databases, records the answers, and compares them with
// internal/apispec/examples.json, from which make docs writes the
// examples of docs/. So every example of the spec is an answer of the API
// as it is now, and a change of an answer fails here until make docs has
// recorded it. Ids, times and request ids are written as fixed example
// values (the same value for the same real one); nothing else is changed.
func TestAPIExamples(t *testing.T) {
	t.Parallel()
	rec := &exRecorder{t: t, ids: map[string]string{}, ops: map[string]*exOp{}}
	for _, id := range []string{exMissingID, exCreateKey, exStartKey, exHookKey} {
		rec.ids[id] = id
	}
	rec.recordMain()
	rec.recordInFlight()
	rec.recordTimeouts()
	rec.recordKeyRequired()
	rec.recordFailures()
	rec.recordRateLimit()
	rec.recordOverload()
	rec.recordDraining()

	got, err := rec.file().Marshal()
	require.NoError(t, err)
	if *updateExamples {
		require.NoError(t, os.WriteFile(examplesFile, got, 0o644))
		t.Logf("wrote %s", examplesFile)
		return
	}
	want, err := os.ReadFile(examplesFile)
	require.NoError(t, err, "run make docs")
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Fatalf("the API no longer answers what %s (the spec's examples) says: run make docs.\n-file +now:\n%s", examplesFile, diff)
	}
}

// recordMain records the answers of an organisation with the demo workflow,
// in an order that makes every answer the same at every recording.
func (rec *exRecorder) recordMain() {
	t := rec.t
	e := apitest.New(t)
	ctx := context.Background()
	acme := e.NewOrg("Acme")
	q := int64(exDemoQuota)
	require.NoError(t, models.NewOrgStore(e.DB).SetQuota(ctx, acme.ID, &q))
	tok := acme.Token

	rec.example(opIndex, 200, "", "", rec.send(e, "index", http.MethodGet, "/", "", nil))
	rec.example(opHealthz, 200, "", "", rec.send(e, "healthz", http.MethodGet, "/healthz", "", nil))
	rec.example(opReadyz, 200, "", "", rec.send(e, "readyz", http.MethodGet, "/readyz", "", nil))
	rec.example(opProblems, 200, "", "with `Accept: text/markdown` (HTML without it)",
		rec.send(e, "problems", http.MethodGet, "/problems/", "", nil, "Accept", "text/markdown"))
	rec.example(opProblem, 200, "", "with `Accept: text/markdown` (HTML without it)",
		rec.send(e, "problem", http.MethodGet, "/problems/idempotency_key_reused", "", nil, "Accept", "text/markdown"))
	rec.example(opProblem, 404, "not_found", "a code no problem has",
		rec.send(e, "problem unknown", http.MethodGet, "/problems/no_such_code", "", nil))

	// The demo workflow.
	rec.request(opCreateWF, exWorkflowBody, idempotency.HeaderPrefer, exPrefer)
	created := rec.send(e, "create", http.MethodPost, "/api/workflows/", tok, exWorkflowBody,
		idempotency.HeaderKey, exCreateKey, idempotency.HeaderPrefer, exPrefer)
	rec.example(opCreateWF, 201, "", "the demo workflow of `make run`, with a new Idempotency-Key", created)
	wf := created.field(t, "id")
	rec.ids[wf] = exWorkflowID
	rec.example(opListWF, 200, "", "", rec.send(e, "list workflows", http.MethodGet, "/api/workflows/?limit=20", tok, nil))
	rec.example(opGetWF, 200, "", "", rec.send(e, "get workflow", http.MethodGet, "/api/workflows/"+wf+"/", tok, nil))

	// A webhook endpoint, which hears of the runs below.
	rec.request(opCreateHook, exHookBody)
	hookCreated := rec.send(e, "create hook", http.MethodPost, "/api/webhook-endpoints/", tok, exHookBody, idempotency.HeaderKey, exHookKey)
	rec.example(opCreateHook, 201, "", "an https URL, with a new Idempotency-Key", hookCreated)
	hook := hookCreated.field(t, "id")
	rec.ids[hook] = exHookID
	hookPath := "/api/webhook-endpoints/" + hook + "/"

	// A run it passes, and one it fails.
	start := "/api/workflows/" + wf + "/start/"
	rec.request(opStart, exStartBody, idempotency.HeaderPrefer, exPrefer)
	started := rec.send(e, "start", http.MethodPost, start, tok, exStartBody,
		idempotency.HeaderKey, exStartKey, idempotency.HeaderPrefer, exPrefer)
	rec.example(opStart, 201, "", "a submission the demo workflow passes, with a new Idempotency-Key; the run is queued", started)
	run := started.field(t, "id")
	rec.ids[run] = exRunID
	require.Equal(t, models.RunPassed, exExecute(t, e, run), "the start example is a submission the demo workflow passes")

	failing := rec.send(e, "start failing", http.MethodPost, start, tok,
		`{"submission":{"customer":"","total":-5},"metadata":{"source":"upload"}}`)
	rec.also(opStart, 201, "", "without an Idempotency-Key", failing)
	failed := failing.field(t, "id")
	rec.ids[failed] = exFailedRunID
	require.Equal(t, models.RunFailed, exExecute(t, e, failed))
	rec.example(opGetRun, 200, "", "a run that has failed: its findings", rec.send(e, "get run", http.MethodGet, "/api/runs/"+failed+"/", tok, nil))
	rec.example(opListRuns, 200, "", "", rec.send(e, "list runs", http.MethodGet, "/api/runs/?workflow_id="+wf+"&limit=20", tok, nil))
	rec.also(opListRuns, 200, "", "`?status=failed`: the organisation's failed runs",
		rec.send(e, "list failed runs", http.MethodGet, "/api/runs/?status=failed&limit=20", tok, nil))
	rec.example(opUsage, 200, "", "", rec.send(e, "usage", http.MethodGet, "/api/usage", tok, nil))
	rec.example(opKey, 200, "", "the key of the start example", rec.send(e, "key", http.MethodGet, exStartKeyURL, tok, nil))

	// A webhook endpoint: created, read, listed, its secret rotated; and
	// another, deleted.
	rec.also(opCreateHook, 201, "", "the same request again: the replay of the first answer",
		rec.send(e, "create hook again", http.MethodPost, "/api/webhook-endpoints/", tok, exHookBody, idempotency.HeaderKey, exHookKey))
	rec.example(opCreateHook, 422, "idempotency_key_reused", "the Idempotency-Key of the 201 example sent with another body",
		rec.send(e, "create hook reused", http.MethodPost, "/api/webhook-endpoints/", tok, `{"url":"https://example.com/other"}`, idempotency.HeaderKey, exHookKey))
	rec.example(opCreateHook, 400, "validation_error", "a URL to a loopback address (the server does not set WEBHOOK_ALLOW_PRIVATE_TARGETS)",
		rec.send(e, "create hook private", http.MethodPost, "/api/webhook-endpoints/", tok, `{"url":"http://127.0.0.1:8080/hooks"}`))
	rec.also(opCreateHook, 400, "validation_error", "an event type that does not exist",
		rec.send(e, "create hook event", http.MethodPost, "/api/webhook-endpoints/", tok, `{"url":"https://example.com/hooks","events":["run.started"]}`))
	rec.example(opGetHook, 200, "", "", rec.send(e, "get hook", http.MethodGet, hookPath, tok, nil))
	dels := rec.send(e, "deliveries", http.MethodGet, hookPath+"deliveries/?limit=20", tok, nil)
	var delList handlers.WebhookDeliveryList
	dels.JSON(t, &delList)
	require.Len(t, delList.Data, 2, "one event per run that ended")
	for i, d := range delList.Data {
		rec.ids[d.ID] = exDeliveryIDs[i]
	}
	rec.example(opDeliveries, 200, "", "the events of the two runs above, recorded with their final state", dels)
	rec.example(opDeliveries, 400, "validation_error", "`?limit=0`", rec.send(e, "deliveries limit", http.MethodGet, hookPath+"deliveries/?limit=0", tok, nil))
	rec.also(opDeliveries, 400, "invalid_cursor", "a cursor this API did not return", rec.send(e, "deliveries cursor", http.MethodGet, hookPath+"deliveries/?cursor=abc", tok, nil))
	rec.example(opDeliveries, 404, "not_found", "an id no endpoint of the organisation has",
		rec.send(e, "deliveries missing", http.MethodGet, "/api/webhook-endpoints/"+exMissingID+"/deliveries/", tok, nil))
	// Support: a delivery sent again, a test event.
	resend := hookPath + "deliveries/" + delList.Data[1].ID + "/redeliver/"
	rec.example(opRedeliver, 202, "", "the passed run's delivery sent again, with a new Idempotency-Key: due now, the same event",
		rec.send(e, "redeliver", http.MethodPost, resend, tok, nil, idempotency.HeaderKey, exResendKey))
	rec.also(opRedeliver, 202, "", "the same request again: the replay of the first answer (one attempt asked for)",
		rec.send(e, "redeliver again", http.MethodPost, resend, tok, nil, idempotency.HeaderKey, exResendKey))
	rec.example(opRedeliver, 422, "idempotency_key_reused", "the Idempotency-Key of the 202 example sent for another delivery",
		rec.send(e, "redeliver reused", http.MethodPost, hookPath+"deliveries/"+delList.Data[0].ID+"/redeliver/", tok, nil, idempotency.HeaderKey, exResendKey))
	rec.example(opRedeliver, 400, idempotency.CodeKeyInvalid, "an empty Idempotency-Key",
		rec.send(e, "redeliver empty key", http.MethodPost, resend, tok, nil, idempotency.HeaderKey, ""))
	rec.also(opRedeliver, 400, idempotency.CodeKeyTooLong, "an Idempotency-Key of 256 characters",
		rec.send(e, "redeliver long key", http.MethodPost, resend, tok, nil, idempotency.HeaderKey, strings.Repeat("k", 256)))
	rec.example(opRedeliver, 404, "not_found", "an id no delivery of the endpoint has",
		rec.send(e, "redeliver missing", http.MethodPost, hookPath+"deliveries/"+exMissingID+"/redeliver/", tok, nil))
	testPath := hookPath + "test/"
	tested := rec.send(e, "test hook", http.MethodPost, testPath, tok, nil, idempotency.HeaderKey, exTestKey)
	var testDelivery handlers.WebhookDelivery
	tested.JSON(t, &testDelivery)
	rec.ids[testDelivery.ID] = exTestDeliveryID
	testEvent, err := uuid.Parse(strings.TrimPrefix(testDelivery.EventID, "evt_"))
	require.NoError(t, err)
	rec.ids[testEvent.String()] = exTestEventID
	rec.example(opTestHook, 202, "", "with a new Idempotency-Key: the test event's delivery, due now", tested)
	rec.also(opTestHook, 202, "", "the same request again: the replay of the first answer (one event recorded)",
		rec.send(e, "test hook again", http.MethodPost, testPath, tok, nil, idempotency.HeaderKey, exTestKey))
	rec.example(opTestHook, 422, "idempotency_key_reused", "the Idempotency-Key of the 202 example sent for another endpoint",
		rec.send(e, "test hook reused", http.MethodPost, "/api/webhook-endpoints/"+exMissingID+"/test/", tok, nil, idempotency.HeaderKey, exTestKey))
	rec.example(opTestHook, 400, idempotency.CodeKeyInvalid, "an empty Idempotency-Key",
		rec.send(e, "test hook empty key", http.MethodPost, testPath, tok, nil, idempotency.HeaderKey, ""))
	rec.also(opTestHook, 400, idempotency.CodeKeyTooLong, "an Idempotency-Key of 256 characters",
		rec.send(e, "test hook long key", http.MethodPost, testPath, tok, nil, idempotency.HeaderKey, strings.Repeat("k", 256)))
	rec.example(opTestHook, 404, "not_found", "an id no endpoint of the organisation has",
		rec.send(e, "test hook missing", http.MethodPost, "/api/webhook-endpoints/"+exMissingID+"/test/", tok, nil))
	for range 4 {
		r := e.Do(http.MethodPost, testPath, tok, nil)
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	}
	rec.example(opTestHook, 429, "test_events_pending", "a sixth test event while five wait for their attempt, with a new Idempotency-Key (the answer is stored)",
		rec.send(e, "test hook full", http.MethodPost, testPath, tok, nil, idempotency.HeaderKey, "1d2c3b4a-5f6e-4d7c-8b9a-0f1e2d3c4b5a"))
	require.NoError(t, e.DB.Exec(`DELETE FROM webhook_deliveries WHERE event_type = ?`, models.EventTest).Error)

	rec.example(opListHooks, 200, "", "", rec.send(e, "list hooks", http.MethodGet, "/api/webhook-endpoints/?limit=20", tok, nil))
	rec.example(opListHooks, 400, "validation_error", "`?limit=0`", rec.send(e, "list hooks limit", http.MethodGet, "/api/webhook-endpoints/?limit=0", tok, nil))
	rec.also(opListHooks, 400, "invalid_cursor", "a cursor this API did not return", rec.send(e, "list hooks cursor", http.MethodGet, "/api/webhook-endpoints/?cursor=abc", tok, nil))
	rec.example(opRotateHook, 200, "", "the new secret; the previous one signs beside it until previous_secret_expires_at",
		rec.send(e, "rotate hook", http.MethodPost, hookPath+"rotate-secret/", tok, nil, idempotency.HeaderKey, exRotateKey))
	rec.also(opRotateHook, 200, "", "the same request again: the replay of the first answer (the rotation happened once)",
		rec.send(e, "rotate hook again", http.MethodPost, hookPath+"rotate-secret/", tok, nil, idempotency.HeaderKey, exRotateKey))
	rec.example(opRotateHook, 422, "idempotency_key_reused", "the Idempotency-Key of the 200 example sent for another endpoint",
		rec.send(e, "rotate hook reused", http.MethodPost, "/api/webhook-endpoints/"+exMissingID+"/rotate-secret/", tok, nil, idempotency.HeaderKey, exRotateKey))
	rec.example(opRotateHook, 400, idempotency.CodeKeyInvalid, "an empty Idempotency-Key",
		rec.send(e, "rotate hook empty key", http.MethodPost, hookPath+"rotate-secret/", tok, nil, idempotency.HeaderKey, ""))
	rec.also(opRotateHook, 400, idempotency.CodeKeyTooLong, "an Idempotency-Key of 256 characters",
		rec.send(e, "rotate hook long key", http.MethodPost, hookPath+"rotate-secret/", tok, nil, idempotency.HeaderKey, strings.Repeat("k", 256)))
	rec.example(opGetHook, 404, "not_found", "an id no endpoint of the organisation has",
		rec.send(e, "get hook missing", http.MethodGet, "/api/webhook-endpoints/"+exMissingID+"/", tok, nil))
	rec.also(opGetHook, 404, "not_found", "an id that is not a UUID", rec.send(e, "get hook bad id", http.MethodGet, "/api/webhook-endpoints/orders/", tok, nil))
	rec.example(opRotateHook, 404, "not_found", "an id no endpoint of the organisation has",
		rec.send(e, "rotate hook missing", http.MethodPost, "/api/webhook-endpoints/"+exMissingID+"/rotate-secret/", tok, nil))
	gone := e.Do(http.MethodPost, "/api/webhook-endpoints/", tok, exHookBody)
	require.Equal(t, http.StatusCreated, gone.Status, "%s", gone.Body)
	rec.ids[gone.Map(t)["id"].(string)] = exGoneHookID
	gonePath := "/api/webhook-endpoints/" + gone.Map(t)["id"].(string) + "/"
	rec.example(opDeleteHook, 204, "", "", rec.send(e, "delete hook", http.MethodDelete, gonePath, tok, nil))
	rec.example(opDeleteHook, 404, "not_found", "an endpoint already deleted",
		rec.send(e, "delete hook again", http.MethodDelete, gonePath, tok, nil))

	// Retries: replays, and the key with another body.
	rec.also(opCreateWF, 201, "", "the same request again: the replay of the first answer",
		rec.send(e, "create again", http.MethodPost, "/api/workflows/", tok, exWorkflowBody, idempotency.HeaderKey, exCreateKey))
	rec.also(opStart, 201, "", "the same request again: the replay of the first answer",
		rec.send(e, "start again", http.MethodPost, start, tok, exStartBody, idempotency.HeaderKey, exStartKey))
	rec.example(opCreateWF, 422, "idempotency_key_reused", "the Idempotency-Key of the 201 example sent with another body",
		rec.send(e, "create reused", http.MethodPost, "/api/workflows/", tok, `{"name":"invoice v2"}`, idempotency.HeaderKey, exCreateKey))
	rec.example(opStart, 422, "idempotency_key_reused", "the Idempotency-Key of the 201 example sent with another body",
		rec.send(e, "start reused", http.MethodPost, start, tok, `{"submission":{"customer":"ACME","total":43}}`, idempotency.HeaderKey, exStartKey))

	// Bad requests.
	rec.example(opCreateWF, 400, "invalid_workflow", "an assertion whose expression does not compile (`total` for `submission.total`)",
		rec.send(e, "create invalid", http.MethodPost, "/api/workflows/", tok,
			`{"name":"invoice","assertions":[{"name":"positive_total","expr":"total > 0","severity":"error","message":"total must be positive"}]}`,
			idempotency.HeaderKey, "b1e0c9d8-7a6f-4e5d-9c4b-3a2f1e0d9c8b"))
	rec.also(opCreateWF, 400, "validation_error", "no name", rec.send(e, "create no name", http.MethodPost, "/api/workflows/", tok, `{"schema":{"type":"object"}}`))
	rec.example(opStart, 400, "validation_error", `a body with "Submission" for "submission"`,
		rec.send(e, "start typo", http.MethodPost, start, tok, `{"Submission":{"customer":"ACME","total":42}}`,
			idempotency.HeaderKey, "e7d6c5b4-a392-4817-9f6e-5d4c3b2a1f0e"))
	rec.also(opStart, 400, "validation_error", "no submission", rec.send(e, "start no submission", http.MethodPost, start, tok, `{"metadata":{"source":"upload"}}`))
	for _, o := range []struct{ op, path string }{{opCreateWF, "/api/workflows/"}, {opStart, start}, {opCreateHook, "/api/webhook-endpoints/"}} {
		rec.also(o.op, 400, idempotency.CodeInvalidJSON, "a body that is not JSON",
			rec.send(e, o.op+" not json", http.MethodPost, o.path, tok, `{"submission":`))
		rec.also(o.op, 400, idempotency.CodeInvalidNumber, "a number of more than 256 digits in decimal",
			rec.send(e, o.op+" long number", http.MethodPost, o.path, tok, `{"name":"x","submission":{"total":1e400}}`))
		rec.also(o.op, 400, idempotency.CodeKeyInvalid, "an empty Idempotency-Key",
			rec.send(e, o.op+" empty key", http.MethodPost, o.path, tok, exStartBody, idempotency.HeaderKey, ""))
		rec.also(o.op, 400, idempotency.CodeKeyTooLong, "an Idempotency-Key of 256 characters",
			rec.send(e, o.op+" long key", http.MethodPost, o.path, tok, exStartBody, idempotency.HeaderKey, strings.Repeat("k", 256)))
		rec.example(o.op, 408, idempotency.CodeBodyTimeout, "a body that arrived slower than the server's read timeout",
			rec.send(e, o.op+" slow body", http.MethodPost, o.path, tok, io.MultiReader(strings.NewReader(`{"submission":`), exTimedOut{})))
		rec.example(o.op, 415, "unsupported_content_encoding", "a body sent with Content-Encoding: br",
			rec.send(e, o.op+" br", http.MethodPost, o.path, tok, exStartBody, "Content-Encoding", "br"))
		rec.example(o.op, 413, idempotency.CodeBodyTooLarge, "a body one byte over MAX_BODY_BYTES (1 MiB)",
			rec.send(e, o.op+" too large", http.MethodPost, o.path, tok,
				`{"submission":"`+strings.Repeat("x", int(e.Config.MaxBodyBytes)-16)+`"}`))
	}
	rec.example(opListWF, 400, "validation_error", "`?limit=0`", rec.send(e, "list workflows limit", http.MethodGet, "/api/workflows/?limit=0", tok, nil))
	rec.also(opListWF, 400, "invalid_cursor", "a cursor this API did not return", rec.send(e, "list workflows cursor", http.MethodGet, "/api/workflows/?cursor=abc", tok, nil))
	rec.example(opListRuns, 400, "validation_error", "a workflow_id that is not a UUID",
		rec.send(e, "list runs wf", http.MethodGet, "/api/runs/?workflow_id=invoice", tok, nil))
	rec.also(opListRuns, 400, "validation_error", "`?limit=101`", rec.send(e, "list runs limit", http.MethodGet, "/api/runs/?limit=101", tok, nil))
	rec.also(opListRuns, 400, "validation_error", "`?status=done`", rec.send(e, "list runs status", http.MethodGet, "/api/runs/?status=done", tok, nil))
	rec.also(opListRuns, 400, "validation_error", "`?created_after=2026-11-22` (a date, not an RFC 3339 time)",
		rec.send(e, "list runs created_after", http.MethodGet, "/api/runs/?created_after=2026-11-22", tok, nil))
	rec.also(opListRuns, 400, "invalid_cursor", "a cursor this API did not return", rec.send(e, "list runs cursor", http.MethodGet, "/api/runs/?cursor=abc", tok, nil))
	rec.example(opKey, 400, "validation_error", "a key of 256 characters",
		rec.send(e, "key too long", http.MethodGet, "/api/idempotency-keys/workflow_start/"+strings.Repeat("k", 256), tok, nil))

	// Not found.
	rec.example(opGetWF, 404, "not_found", "an id no workflow of the organisation has",
		rec.send(e, "get workflow missing", http.MethodGet, "/api/workflows/"+exMissingID+"/", tok, nil))
	rec.also(opGetWF, 404, "not_found", "an id that is not a UUID", rec.send(e, "get workflow bad id", http.MethodGet, "/api/workflows/invoice/", tok, nil))
	rec.example(opStart, 404, "not_found", "an id no workflow of the organisation has, with a new Idempotency-Key (the answer is stored)",
		rec.send(e, "start missing", http.MethodPost, "/api/workflows/"+exMissingID+"/start/", tok, exStartBody,
			idempotency.HeaderKey, "0e1d2c3b-4a59-4687-8b9a-a1b2c3d4e5f6"))
	rec.example(opGetRun, 404, "not_found", "an id no run of the organisation has",
		rec.send(e, "get run missing", http.MethodGet, "/api/runs/"+exMissingID+"/", tok, nil))
	rec.also(opGetRun, 404, "not_found", "an id that is not a UUID", rec.send(e, "get run bad id", http.MethodGet, "/api/runs/latest/", tok, nil))
	rec.example(opKey, 404, "not_found", "a key never used",
		rec.send(e, "key missing", http.MethodGet, "/api/idempotency-keys/workflow_start/order-1041", tok, nil))
	rec.also(opKey, 404, "not_found", "a scope that does not exist",
		rec.send(e, "key bad scope", http.MethodGet, "/api/idempotency-keys/workflow_delete/order-1041", tok, nil))

	// Unauthorized.
	for _, o := range []struct{ op, method, path string }{
		{opCreateWF, http.MethodPost, "/api/workflows/"}, {opListWF, http.MethodGet, "/api/workflows/"},
		{opGetWF, http.MethodGet, "/api/workflows/" + wf + "/"}, {opStart, http.MethodPost, start},
		{opListRuns, http.MethodGet, "/api/runs/"}, {opGetRun, http.MethodGet, "/api/runs/" + run + "/"},
		{opUsage, http.MethodGet, "/api/usage"}, {opKey, http.MethodGet, exStartKeyURL},
		{opCreateHook, http.MethodPost, "/api/webhook-endpoints/"}, {opListHooks, http.MethodGet, "/api/webhook-endpoints/"},
		{opGetHook, http.MethodGet, hookPath}, {opDeleteHook, http.MethodDelete, hookPath},
		{opRotateHook, http.MethodPost, hookPath + "rotate-secret/"}, {opDeliveries, http.MethodGet, hookPath + "deliveries/"},
		{opRedeliver, http.MethodPost, resend}, {opTestHook, http.MethodPost, testPath},
	} {
		var body any
		if o.method == http.MethodPost {
			body = exStartBody
		}
		if o.op == opCreateHook {
			body = exHookBody
		} else if o.op == opRotateHook || o.op == opRedeliver || o.op == opTestHook {
			body = nil
		}
		rec.example(o.op, 401, "unauthenticated", "no Authorization header",
			rec.send(e, o.op+" no token", o.method, o.path, "", body))
		rec.also(o.op, 401, "invalid_token", "a token that is unknown or revoked",
			rec.send(e, o.op+" bad token", o.method, o.path, "vr_0000000000000000000000000000000000000000", body))
		rec.also(o.op, 401, "unauthenticated", "more than one credential (two Authorization headers, or one listing two)",
			rec.send(e, o.op+" two tokens", o.method, o.path, "", body, "Authorization", "Bearer "+tok, "Authorization", "Bearer "+tok))
	}

	// A request in flight holds its key's lock: another with the key is 409.
	for _, o := range []struct{ op, scope, path, body string }{
		{opCreateWF, handlers.ScopeWorkflowCreate, "/api/workflows/", exWorkflowBody},
		{opStart, handlers.ScopeWorkflowStart, start, exStartBody},
		{opCreateHook, handlers.ScopeWebhookCreate, "/api/webhook-endpoints/", exHookBody},
		{opRotateHook, handlers.ScopeWebhookRotate, hookPath + "rotate-secret/", ""},
		{opRedeliver, handlers.ScopeWebhookResend, resend, ""},
		{opTestHook, handlers.ScopeWebhookTest, testPath, ""},
	} {
		key := "6a5b4c3d-2e1f-4a0b-9c8d-7e6f5a4b3c2d"
		release := idemHoldKeyLock(t, e, acme.ID, o.scope, key)
		rec.example(o.op, 409, idempotency.CodeKeyInProgress, "the Idempotency-Key of a request still being processed",
			rec.send(e, o.op+" in flight", http.MethodPost, o.path, tok, o.body, idempotency.HeaderKey, key))
		if o.scope == handlers.ScopeWorkflowStart {
			rec.also(opKey, 200, "", "a key whose first request is being processed",
				rec.send(e, "key in flight", http.MethodGet, "/api/idempotency-keys/workflow_start/"+key, tok, nil))
		}
		release()
	}

	// A key past its expiry.
	old := rec.send(e, "start old", http.MethodPost, start, tok, exStartBody, idempotency.HeaderKey, "order-1040")
	require.Equal(t, http.StatusCreated, old.Status, "%s", old.Body)
	require.NoError(t, e.DB.Exec(`UPDATE idempotency_keys SET created_at = created_at - interval '25 hours',
		expires_at = expires_at - interval '25 hours' WHERE key = 'order-1040'`).Error)
	rec.also(opKey, 200, "", "a key past its expiry", rec.send(e, "key expired", http.MethodGet, "/api/idempotency-keys/workflow_start/order-1040", tok, nil))

	// Past the quota.
	small := e.NewOrg("Small")
	q = exSmallQuota
	require.NoError(t, models.NewOrgStore(e.DB).SetQuota(ctx, small.ID, &q))
	smallWF := e.NewWorkflow(small, exWorkflowBody)
	rec.ids[smallWF] = exWorkflowID
	for i := range exSmallQuota {
		r := e.Do(http.MethodPost, "/api/workflows/"+smallWF+"/start/", small.Token, exStartBody)
		require.Equal(t, http.StatusCreated, r.Status, "start %d: %s", i, r.Body)
	}
	rec.example(opStart, 429, "quota_exceeded", fmt.Sprintf("a start past a monthly quota of %d runs, with a new Idempotency-Key (the answer is stored)", exSmallQuota),
		rec.send(e, "start over quota", http.MethodPost, "/api/workflows/"+smallWF+"/start/", small.Token, exStartBody,
			idempotency.HeaderKey, "f0e1d2c3-b4a5-4968-8776-655443322110"))

	// Last, so that it counts the requests above (always the same ones).
	metrics := rec.send(e, "metrics", http.MethodGet, "/metrics", "", nil)
	metrics.Body = exMetricsExcerpt(t, metrics.Body)
	rec.example(opMetrics, 200, "", "an excerpt: the idempotent requests of the recording, by outcome", metrics)
}

// recordInFlight records the answers to a request sent with `Prefer: wait`
// while the first request with its key is being processed: it waits, and
// gets the first's answer (or 422) with Preference-Applied.
func (rec *exRecorder) recordInFlight() {
	t := rec.t
	e := apitest.New(t)
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, exWorkflowBody)
	start := "/api/workflows/" + wf + "/start/"
	r := e.Do(http.MethodPost, start, org.Token, exStartBody)
	require.Equal(t, http.StatusCreated, r.Status, "a first run creates the usage slots: %s", r.Body)

	for _, o := range []struct {
		op, path, body, other string
		hold                  func() func()
	}{
		{opCreateWF, "/api/workflows/", exWorkflowBody, `{"name":"invoice v2"}`, func() func() { return exLockTable(t, e, "workflows") }},
		{opStart, start, exStartBody, `{"submission":{"customer":"ACME","total":43}}`, func() func() { return idemLockUsage(t, e, org.ID) }},
	} {
		for _, c := range []struct {
			status    int
			code      string
			body      string
			situation string
		}{
			{201, "", o.body, "the same request, with `Prefer: wait=5`, while the first is being processed: the first's answer once it is done"},
			{422, idempotency.CodeKeyReused, o.other, "another body with the key of a request being processed, with `Prefer: wait=5`: 422 once it is done"},
		} {
			// The waiting request must have found the first in flight,
			// which nothing shows from outside before it answers: wait
			// longer each time until it has.
			for attempt, pause := 1, 100*time.Millisecond; ; attempt, pause = attempt+1, 2*pause {
				key := fmt.Sprintf("wait-%s-%d-%d", strings.Trim(o.op[5:], "/{}"), c.status, attempt)
				release := o.hold()
				first := waitFor(func() apitest.Response {
					return e.Do(http.MethodPost, o.path, org.Token, o.body, idempotency.HeaderKey, key)
				})
				idemWaitLockWaiter(t, e)
				headers := []string{idempotency.HeaderKey, key, idempotency.HeaderPrefer, exPrefer}
				waiter := waitFor(func() apitest.Response {
					return exDo(e, o.op+" wait", http.MethodPost, o.path, org.Token, c.body, headers...)
				})
				time.Sleep(pause)
				release()
				f := <-first
				require.Equal(t, http.StatusCreated, f.Status, "%s", f.Body)
				w := rec.keyed(e, <-waiter, headers)
				if w.Header.Get(idempotency.HeaderPreferenceApplied) != "" {
					rec.also(o.op, c.status, c.code, c.situation, w)
					break
				}
				require.Less(t, attempt, 6, "the waiting request never found the first in flight")
			}
		}
	}
}

// recordTimeouts records 503 request_timeout: a request whose transaction
// outlives IDEMPOTENCY_TX_TIMEOUT, blocked behind locks the test holds.
// Only those requests go through an API with a 300 ms transaction deadline
// (they outlive it whatever the machine's speed); the setup has the default
// budget, so a slow machine cannot time it out.
func (rec *exRecorder) recordTimeouts() {
	t := rec.t
	e := apitest.New(t)
	short := e.WithConfig(func(c *config.Config) { c.IdempotencyTxTimeout = 300 * time.Millisecond })
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, exWorkflowBody)
	rec.ids[wf] = exWorkflowID
	start := "/api/workflows/" + wf + "/start/"
	r := e.Do(http.MethodPost, start, org.Token, exStartBody)
	require.Equal(t, http.StatusCreated, r.Status, "a first run creates the usage slots: %s", r.Body)

	situation := "a request whose transaction ran past IDEMPOTENCY_TX_TIMEOUT (it was rolled back)"
	release := exLockTable(t, e, "workflows")
	rec.also(opCreateWF, 503, idempotency.CodeTimeout, situation,
		rec.send(short, "create timeout", http.MethodPost, "/api/workflows/", org.Token, exWorkflowBody, idempotency.HeaderKey, "timeout-1"))
	release()
	h := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, exHookBody)
	require.Equal(t, http.StatusCreated, h.Status, "%s", h.Body)
	rec.ids[h.Map(t)["id"].(string)] = exHookID
	release = exLockTable(t, e, "webhook_endpoints")
	rec.also(opCreateHook, 503, idempotency.CodeTimeout, situation,
		rec.send(short, "create hook timeout", http.MethodPost, "/api/webhook-endpoints/", org.Token, exHookBody, idempotency.HeaderKey, "timeout-1"))
	rec.also(opRotateHook, 503, idempotency.CodeTimeout, situation,
		rec.send(short, "rotate hook timeout", http.MethodPost, "/api/webhook-endpoints/"+h.Map(t)["id"].(string)+"/rotate-secret/", org.Token, nil, idempotency.HeaderKey, "timeout-2"))
	release()
	release = exLockTable(t, e, "webhook_deliveries")
	rec.also(opTestHook, 503, idempotency.CodeTimeout, situation,
		rec.send(short, "test hook timeout", http.MethodPost, "/api/webhook-endpoints/"+h.Map(t)["id"].(string)+"/test/", org.Token, nil, idempotency.HeaderKey, "timeout-3"))
	rec.also(opRedeliver, 503, idempotency.CodeTimeout, situation,
		rec.send(short, "redeliver timeout", http.MethodPost, "/api/webhook-endpoints/"+h.Map(t)["id"].(string)+"/deliveries/"+exMissingID+"/redeliver/", org.Token, nil, idempotency.HeaderKey, "timeout-4"))
	release()
	release = idemLockUsage(t, e, org.ID)
	rec.also(opStart, 503, idempotency.CodeTimeout, situation,
		rec.send(short, "start timeout", http.MethodPost, start, org.Token, exStartBody, idempotency.HeaderKey, "timeout-1"))
	release()
}

// recordKeyRequired records 400 idempotency_key_missing.
func (rec *exRecorder) recordKeyRequired() {
	t := rec.t
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.IdempotencyKeyRequired = true }})
	org := e.NewOrg("Acme")
	r := e.Do(http.MethodPost, "/api/workflows/", org.Token, exWorkflowBody, idempotency.HeaderKey, "setup")
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	wf := r.Map(t)["id"].(string)
	situation := "no Idempotency-Key while the server runs with IDEMPOTENCY_KEY_REQUIRED=true"
	rec.also(opCreateWF, 400, idempotency.CodeKeyMissing, situation,
		rec.send(e, "create no key", http.MethodPost, "/api/workflows/", org.Token, exWorkflowBody))
	rec.also(opCreateHook, 400, idempotency.CodeKeyMissing, situation,
		rec.send(e, "create hook no key", http.MethodPost, "/api/webhook-endpoints/", org.Token, exHookBody))
	h := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, exHookBody, idempotency.HeaderKey, "setup-hook")
	require.Equal(t, http.StatusCreated, h.Status, "%s", h.Body)
	rec.ids[h.Map(t)["id"].(string)] = exHookID
	rec.also(opRotateHook, 400, idempotency.CodeKeyMissing, situation,
		rec.send(e, "rotate hook no key", http.MethodPost, "/api/webhook-endpoints/"+h.Map(t)["id"].(string)+"/rotate-secret/", org.Token, nil))
	rec.also(opRedeliver, 400, idempotency.CodeKeyMissing, situation,
		rec.send(e, "redeliver no key", http.MethodPost, "/api/webhook-endpoints/"+h.Map(t)["id"].(string)+"/deliveries/"+exMissingID+"/redeliver/", org.Token, nil))
	rec.also(opTestHook, 400, idempotency.CodeKeyMissing, situation,
		rec.send(e, "test hook no key", http.MethodPost, "/api/webhook-endpoints/"+h.Map(t)["id"].(string)+"/test/", org.Token, nil))
	rec.also(opStart, 400, idempotency.CodeKeyMissing, situation,
		rec.send(e, "start no key", http.MethodPost, "/api/workflows/"+wf+"/start/", org.Token, exStartBody))
}

// recordFailures records 500 (the tables renamed away: every query fails)
// and 503 (the database refuses connections, as while it restarts).
func (rec *exRecorder) recordFailures() {
	t := rec.t
	e := apitest.New(t) // the token cache on, as in production: requests get past authentication
	org, all := rec.everyAPIRoute(e)
	send := func(name string, o exRouteCall, headers ...string) exResponse {
		var body any
		if o.body != "" {
			body = o.body
			headers = append(headers, idempotency.HeaderKey, "c3b2a190-8f7e-4d6c-b5a4-93827160f5e4")
		}
		return rec.send(e, name+" "+o.op, o.method, o.path, org.Token, body, headers...)
	}

	tables := []string{"workflows", "validation_runs", "usage_slots", "idempotency_keys", "webhook_endpoints", "webhook_deliveries"}
	for _, table := range tables {
		require.NoError(t, e.DB.Exec(`ALTER TABLE `+table+` RENAME TO `+table+`_away`).Error)
	}
	for _, o := range all {
		rec.example(o.op, 500, "internal_error", "a query that failed (its table was renamed away)", send("broken", o))
	}
	for _, table := range tables {
		require.NoError(t, e.DB.Exec(`ALTER TABLE `+table+`_away RENAME TO `+table).Error)
	}

	exDatabaseDown(t, e)
	for _, o := range all {
		rec.example(o.op, 503, idempotency.CodeUnavailable, "while the database refuses connections", send("down", o))
	}
	rec.also(opUsage, 503, idempotency.CodeUnavailable, "a token not seen lately, while the database refuses connections (it cannot be checked)",
		rec.send(e, "usage down new token", http.MethodGet, "/api/usage", "vr_1111111111111111111111111111111111111111", nil))
	rec.example(opReadyz, 503, idempotency.CodeUnavailable, "while the database refuses connections",
		rec.send(e, "readyz down", http.MethodGet, "/readyz", "", nil))
}

// recordDraining records /readyz 503 not_ready: the process drains at
// shutdown (serve's readiness check, as internal/cli gives it).
func (rec *exRecorder) recordDraining() {
	e := apitest.New(rec.t, apitest.Options{Ready: func(context.Context) error { return errors.New("the server is shutting down") }})
	rec.also(opReadyz, 503, "not_ready", "while the process drains at shutdown (SHUTDOWN_DRAIN)",
		rec.send(e, "readyz draining", http.MethodGet, "/readyz", "", nil))
}

// recordRateLimit records the start route under a rate of 1 start per
// second (burst 1): a start that passes, with the RateLimit headers, and
// the next one, 429 rate_limited (nothing stored).
func (rec *exRecorder) recordRateLimit() {
	t := rec.t
	e := apitest.New(t, apitest.Options{Redis: apitest.Redis(t), Config: func(c *config.Config) { c.OrgStartRate = 1 }})
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, exWorkflowBody)
	rec.ids[wf] = exWorkflowID
	start := "/api/workflows/" + wf + "/start/"
	// The bucket is full: the first start passes, leaving it empty. The
	// next is limited unless a second went by (a loaded machine): then
	// the pair is sent again, until the second start meets the empty
	// bucket.
	for i := 0; ; i++ {
		passed := exDo(e, "rate passed", http.MethodPost, start, org.Token, exStartBody)
		require.Equal(t, http.StatusCreated, passed.Status, "%s", passed.Body)
		rec.ids[passed.Map(t)["id"].(string)] = exRunID
		limited := exDo(e, "rate limited", http.MethodPost, start, org.Token, exStartBody,
			idempotency.HeaderKey, "7e3d9b1a-4c2f-4a8e-9d6b-2f1e0c9b8a75")
		if limited.Status == http.StatusCreated {
			require.Less(t, i, 100, "the second start is never limited")
			time.Sleep(time.Second) // both spent the bucket: let it refill
			continue
		}
		rec.also(opStart, 201, "", "a start within the organisation's rate (here 1 start per second): the RateLimit headers say what is left", exResponse{Response: passed})
		rec.also(opStart, 429, problem.RateLimited.String(), "a start past the organisation's rate (here 1 start per second), with a new Idempotency-Key (nothing is stored: the retry executes)",
			exResponse{Response: limited})
		return
	}
}

// recordOverload records 503 overloaded on every /api/ route: one start
// held in flight (its body not yet sent) while the process may serve one
// request at a time (MAX_REQUESTS_IN_FLIGHT=1, OVERLOAD_WAIT=0).
func (rec *exRecorder) recordOverload() {
	t := rec.t
	e := apitest.New(t, apitest.Options{Config: func(c *config.Config) { c.MaxRequestsInFlight, c.OverloadWait = 1, 0 }})
	org, all := rec.everyAPIRoute(e)
	start := all[slices.IndexFunc(all, func(o exRouteCall) bool { return o.op == opStart })].path

	pr, pw := io.Pipe()
	held := make(chan apitest.Response, 1)
	go func() { held <- e.Do(http.MethodPost, start, org.Token, pr) }()
	waitGauge(t, e.Registry, "valruns_http_requests_in_flight", 1)
	for _, o := range all {
		var body any
		if o.body != "" {
			body = o.body
		}
		rec.also(o.op, 503, problem.Overloaded.String(), "while the process serves as many requests as it may (`MAX_REQUESTS_IN_FLIGHT`, `MAX_BODY_BYTES_IN_FLIGHT`)",
			rec.send(e, "overloaded "+o.op, o.method, o.path, org.Token, body))
	}
	_, err := pw.Write([]byte(exStartBody))
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	require.Equal(t, http.StatusCreated, (<-held).Status)
}

// exRouteCall is one request to one route of the API, for the examples every
// route has (500, 503).
type exRouteCall struct{ op, method, path, body string }

// everyAPIRoute makes, on e, an organisation with a workflow, a run of it
// and a webhook endpoint (their ids recorded as the examples'), and returns
// one request to each /api/ route that needs them. A route added to the
// API is added here once, and gets every such example.
func (rec *exRecorder) everyAPIRoute(e *apitest.Env) (apitest.Org, []exRouteCall) {
	t := rec.t
	org := e.NewOrg("Acme")
	wf := e.NewWorkflow(org, exWorkflowBody)
	rec.ids[wf] = exWorkflowID
	start := "/api/workflows/" + wf + "/start/"
	r := e.Do(http.MethodPost, start, org.Token, exStartBody)
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	run := r.Map(t)["id"].(string)
	rec.ids[run] = exRunID
	h := e.Do(http.MethodPost, "/api/webhook-endpoints/", org.Token, exHookBody)
	require.Equal(t, http.StatusCreated, h.Status, "%s", h.Body)
	hookPath := "/api/webhook-endpoints/" + h.Map(t)["id"].(string) + "/"
	rec.ids[h.Map(t)["id"].(string)] = exHookID
	return org, []exRouteCall{
		{opCreateWF, http.MethodPost, "/api/workflows/", exWorkflowBody},
		{opListWF, http.MethodGet, "/api/workflows/", ""},
		{opGetWF, http.MethodGet, "/api/workflows/" + wf + "/", ""},
		{opStart, http.MethodPost, start, exStartBody},
		{opListRuns, http.MethodGet, "/api/runs/", ""},
		{opGetRun, http.MethodGet, "/api/runs/" + run + "/", ""},
		{opUsage, http.MethodGet, "/api/usage", ""},
		{opKey, http.MethodGet, exStartKeyURL, ""},
		{opCreateHook, http.MethodPost, "/api/webhook-endpoints/", exHookBody},
		{opListHooks, http.MethodGet, "/api/webhook-endpoints/", ""},
		{opGetHook, http.MethodGet, hookPath, ""},
		{opDeleteHook, http.MethodDelete, hookPath, ""},
		{opRotateHook, http.MethodPost, hookPath + "rotate-secret/", ""},
		{opDeliveries, http.MethodGet, hookPath + "deliveries/", ""},
		{opRedeliver, http.MethodPost, hookPath + "deliveries/" + exMissingID + "/redeliver/", ""},
		{opTestHook, http.MethodPost, hookPath + "test/", ""},
	}
}

// exDatabaseDown takes e's database away as a restart does: its connections
// end and new ones are refused, until the end of the test.
func exDatabaseDown(t *testing.T, e *apitest.Env) {
	admin, err := sql.Open("pgx", withDatabase(t, e.DBURL, "postgres"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	var name string
	require.NoError(t, e.DB.Raw(`SELECT current_database()`).Scan(&name).Error)
	allow := func(allowed bool) {
		_, err := admin.Exec(fmt.Sprintf(`ALTER DATABASE %q WITH ALLOW_CONNECTIONS %t`, name, allowed))
		require.NoError(t, err)
	}
	allow(false)
	t.Cleanup(func() { allow(true) })
	_, err = admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name)
	require.NoError(t, err)
}

// exLockTable locks table against writes from a connection of its own, in
// an open transaction, until release (also at cleanup).
func exLockTable(t *testing.T, e *apitest.Env, table string) (release func()) {
	t.Helper()
	db, err := sql.Open("pgx", e.DBURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	tx, err := db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	_, err = tx.Exec(`LOCK TABLE ` + table + ` IN SHARE MODE`)
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(release)
	return release
}

// exExecute executes a queued run as the worker does (claim, validate,
// finish) and returns its final status.
func exExecute(t *testing.T, e *apitest.Env, runID string) string {
	t.Helper()
	ctx := context.Background()
	runs := models.NewRunStore(e.DB)
	claimed, err := runs.Claim(ctx, runID, time.Minute, 1)
	require.NoError(t, err)
	var assertions []validate.Assertion
	require.NoError(t, json.Unmarshal(claimed.Assertions, &assertions))
	prog, _, err := validate.Compile(json.RawMessage(claimed.Schema), assertions)
	require.NoError(t, err)
	findings, err := prog.Run(ctx, claimed.Submission, claimed.Metadata)
	require.NoError(t, err)
	status := models.RunPassed
	if validate.Failed(findings) {
		status = models.RunFailed
	}
	rows := make([]models.Finding, len(findings))
	for i, f := range findings {
		rows[i] = models.Finding{Step: f.Step, Severity: f.Severity, Path: f.Path, Message: f.Message}
	}
	owned, err := runs.Finish(ctx, runID, claimed.Attempts, status, rows)
	require.NoError(t, err)
	require.True(t, owned)
	return status
}

// exMetricsExcerpt keeps the lines of valruns_idempotency_requests_total:
// the other metrics hold times and the process's own numbers.
func exMetricsExcerpt(t *testing.T, body []byte) []byte {
	var out []string
	for line := range strings.SplitSeq(string(body), "\n") {
		name := strings.TrimPrefix(strings.TrimPrefix(line, "# HELP "), "# TYPE ")
		if strings.HasPrefix(name, "valruns_idempotency_requests_total") {
			out = append(out, line)
		}
	}
	require.NotEmpty(t, out, "/metrics has valruns_idempotency_requests_total:\n%s", body)
	return []byte(strings.Join(out, "\n") + "\n")
}

// exRecorder collects the answers of TestAPIExamples.
type exRecorder struct {
	t *testing.T
	// ids maps a real id (or key) in an example to the value it is written as.
	ids map[string]string
	ops map[string]*exOp
	mu  sync.Mutex
}

type exOp struct {
	request  *apispec.Request
	examples map[int]*exAnswer
	also     map[int][]apispec.Variant
}

type exAnswer struct {
	situation string
	r         exResponse
}

// exResponse is an answer, with what is needed to write its
// Idempotency-Key-Expires as an example: when its key was created.
type exResponse struct {
	apitest.Response
	keyCreated time.Time
}

func (r exResponse) field(t *testing.T, name string) string {
	t.Helper()
	v, _ := r.Map(t)[name].(string)
	require.NotEmpty(t, v, "%d %s has no %s", r.Status, r.Body, name)
	return v
}

// send sends a request through e's router with an X-Request-Id made from
// name, so that request ids are the same at every recording.
func (rec *exRecorder) send(e *apitest.Env, name, method, path, token string, body any, headers ...string) exResponse {
	return rec.keyed(e, exDo(e, name, method, path, token, body, headers...), headers)
}

// exDo is the request of send, safe to call from any goroutine.
func exDo(e *apitest.Env, name, method, path, token string, body any, headers ...string) apitest.Response {
	sum := sha256.Sum256([]byte(name))
	return e.Do(method, path, token, body, append([]string{"X-Request-Id", hex.EncodeToString(sum[:12])}, headers...)...)
}

// keyed adds to r, sent with headers, when its key was created if it
// carries Idempotency-Key-Expires.
func (rec *exRecorder) keyed(e *apitest.Env, r apitest.Response, headers []string) exResponse {
	rec.t.Helper()
	out := exResponse{Response: r}
	if r.Header.Get(idempotency.HeaderKeyExpires) == "" {
		return out
	}
	var key string
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == idempotency.HeaderKey {
			key = headers[i+1]
		}
	}
	var created []time.Time
	require.NoError(rec.t, e.DB.Raw(`SELECT created_at FROM idempotency_keys WHERE key = ?`, key).Scan(&created).Error)
	require.Len(rec.t, created, 1, "the key %q of an answer with %s", key, idempotency.HeaderKeyExpires)
	out.keyCreated = created[0]
	return out
}

func (rec *exRecorder) op(name string) *exOp {
	o := rec.ops[name]
	if o == nil {
		o = &exOp{examples: map[int]*exAnswer{}, also: map[int][]apispec.Variant{}}
		rec.ops[name] = o
	}
	return o
}

// request records the request of op's success example.
func (rec *exRecorder) request(op, body string, headers ...string) {
	req := &apispec.Request{Body: json.RawMessage(body), Headers: map[string]string{}}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Headers[headers[i]] = headers[i+1]
	}
	rec.op(op).request = req
}

// example records r as the example of op's status: it must be that
// status, and have that problem code ("" for other answers).
func (rec *exRecorder) example(op string, status int, code, situation string, r exResponse) {
	rec.t.Helper()
	rec.check(op, status, code, r)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	o := rec.op(op)
	require.Nil(rec.t, o.examples[status], "%s %d has an example already", op, status)
	o.examples[status] = &exAnswer{situation: situation, r: r}
}

// also records another situation answered with op's status.
func (rec *exRecorder) also(op string, status int, code, situation string, r exResponse) {
	rec.t.Helper()
	rec.check(op, status, code, r)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	o := rec.op(op)
	o.also[status] = append(o.also[status], apispec.Variant{Situation: situation, Code: code, Headers: headerNames(r.Header)})
}

func (rec *exRecorder) check(op string, status int, code string, r exResponse) {
	rec.t.Helper()
	require.Equal(rec.t, status, r.Status, "%s: %s", op, r.Body)
	if code == "" {
		require.NotEqual(rec.t, "application/problem+json", r.Header.Get("Content-Type"), "%s: %s", op, r.Body)
		return
	}
	d := idemProblem(rec.t, r.Response)
	require.Equal(rec.t, code, d.Code, "%s: %s", op, r.Body)
}

// exTimedOut is a body whose reading hits the server's read deadline.
type exTimedOut struct{}

func (exTimedOut) Read([]byte) (int, error) { return 0, os.ErrDeadlineExceeded }

// headerNames are the names of h but Content-Type (the example's media
// type), Vary (of /metrics, about content negotiation) and Connection (a
// hop-by-hop header of the connection, not of the API: a 413 closes it).
func headerNames(h http.Header) []string {
	var out []string
	for name := range h {
		if name != "Content-Type" && name != "Vary" && name != "Connection" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// file is what was recorded, with the example values written in.
func (rec *exRecorder) file() *apispec.File {
	t := rec.t
	n := &exNormaliser{t: t, ids: rec.ids, times: map[int64]time.Time{}}
	// Every instant an example shows, in order, becomes exBase plus one
	// second per instant before it.
	var instants []time.Time
	for _, o := range rec.ops {
		for _, a := range o.examples {
			if !a.r.keyCreated.IsZero() {
				instants = append(instants, a.r.keyCreated)
			}
			if strings.Contains(a.r.Header.Get("Content-Type"), "json") {
				v, err := apispec.Decode(a.r.Body, false)
				require.NoError(t, err)
				instants = append(instants, n.instants(v)...)
			}
		}
	}
	sort.Slice(instants, func(i, j int) bool { return instants[i].Before(instants[j]) })
	for _, at := range instants {
		if _, ok := n.times[at.UnixNano()]; !ok {
			n.times[at.UnixNano()] = exBase.Add(time.Duration(len(n.times)) * time.Second)
		}
	}

	f := &apispec.File{Operations: map[string]*apispec.Operation{}}
	for name, o := range rec.ops {
		op := &apispec.Operation{Request: o.request, Responses: map[string]*apispec.Response{}}
		for status, a := range o.examples {
			ct := a.r.Header.Get("Content-Type")
			resp := &apispec.Response{Situation: a.situation, ContentType: ct, Headers: map[string]string{}, Also: o.also[status]}
			for _, name := range headerNames(a.r.Header) {
				resp.Headers[name] = n.header(name, a.r.Header.Get(name), a.r.keyCreated)
			}
			if strings.Contains(ct, "json") {
				v, err := apispec.Decode(a.r.Body, false)
				require.NoError(t, err)
				n.value(v)
				resp.Body = v.Compact()
			} else {
				resp.Body, _ = json.Marshal(string(a.r.Body))
			}
			op.Responses[fmt.Sprint(status)] = resp
		}
		for status := range o.also {
			require.Contains(t, o.examples, status, "%s %d: situations recorded but no example", name, status)
		}
		f.Operations[name] = op
	}
	return f
}

// exNormaliser writes ids and times of recorded answers as example values.
type exNormaliser struct {
	t   *testing.T
	ids map[string]string
	// times maps instants (UnixNano) to example times.
	times map[int64]time.Time
}

var (
	exUUID = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	// exInstantFields are the members that say when something happened.
	exInstantFields = map[string]bool{"created_at": true, "started_at": true, "finished_at": true, "next_attempt_at": true, "delivered_at": true}
)

// instants lists the times of v's instant fields and cursors.
func (n *exNormaliser) instants(v *apispec.Value) []time.Time {
	var out []time.Time
	for _, m := range v.Object {
		switch {
		case exInstantFields[m.Key] && m.Value.Str() != "":
			out = append(out, n.parse(m.Value.Str()))
		case m.Key == "next_cursor" && m.Value.Str() != "":
			at, _ := n.cursor(m.Value.Str())
			out = append(out, at)
		}
		out = append(out, n.instants(m.Value)...)
	}
	for _, item := range v.Array {
		out = append(out, n.instants(item)...)
	}
	return out
}

func (n *exNormaliser) parse(s string) time.Time {
	at, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(n.t, err)
	return at
}

func (n *exNormaliser) cursor(c string) (time.Time, string) {
	raw, err := base64.RawURLEncoding.DecodeString(c)
	require.NoError(n.t, err)
	at, id, ok := strings.Cut(string(raw), "|")
	require.True(n.t, ok, "cursor %q", raw)
	return n.parse(at), id
}

func (n *exNormaliser) exampleTime(at time.Time) time.Time {
	ex, ok := n.times[at.UnixNano()]
	require.True(n.t, ok, "no example time for %s", at)
	return ex
}

// value rewrites v in place.
func (n *exNormaliser) value(v *apispec.Value) {
	now := time.Now().UTC()
	period := models.UsagePeriod(now)
	createdAt := v.Get("created_at").Str() // before it is rewritten
	for i, m := range v.Object {
		s := m.Value.Str()
		var out string
		isString := m.Value.Kind == 0 && bytes.HasPrefix(m.Value.Raw, []byte(`"`))
		switch {
		case !isString:
			n.value(m.Value)
			continue
		case exInstantFields[m.Key]:
			out = n.exampleTime(n.parse(s)).Format(time.RFC3339Nano)
		case m.Key == "expires_at":
			created := n.parse(createdAt)
			out = n.exampleTime(created).Add(n.parse(s).Sub(created)).Format(time.RFC3339Nano)
		case m.Key == "event_id":
			u, err := uuid.Parse(strings.TrimPrefix(s, "evt_"))
			require.NoError(n.t, err, "event_id %s", s)
			out = "evt_" + strings.ReplaceAll(n.id(u.String()), "-", "")
		case m.Key == "secret":
			out = exSecret
		case m.Key == "previous_secret_expires_at":
			out = n.exampleTime(n.parse(createdAt)).Add(models.SecretOverlap).Format(time.RFC3339Nano)
		case m.Key == "next_cursor":
			at, id := n.cursor(s)
			out = base64.RawURLEncoding.EncodeToString([]byte(n.exampleTime(at).Format(time.RFC3339Nano) + "|" + n.id(id)))
		case m.Key == "period":
			require.Equal(n.t, period.Format("2006-01"), s)
			out = models.UsagePeriod(exBase).Format("2006-01")
		case m.Key == "period_start":
			require.True(n.t, n.parse(s).Equal(period), "period_start %s", s)
			out = models.UsagePeriod(exBase).Format(time.RFC3339)
		case m.Key == "period_end":
			require.True(n.t, n.parse(s).Equal(period.AddDate(0, 1, 0)), "period_end %s", s)
			out = models.UsagePeriod(exBase).AddDate(0, 1, 0).Format(time.RFC3339)
		default:
			out = n.replaceIDs(s)
		}
		v.Object[i].Value = &apispec.Value{Raw: json.RawMessage(jsonString(out))}
	}
	for i, item := range v.Array {
		if item.Kind == 0 && bytes.HasPrefix(item.Raw, []byte(`"`)) {
			v.Array[i] = &apispec.Value{Raw: json.RawMessage(jsonString(n.replaceIDs(item.Str())))}
			continue
		}
		n.value(item)
	}
}

func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

func (n *exNormaliser) id(id string) string {
	ex, ok := n.ids[id]
	require.True(n.t, ok, "an example shows the id %s, which has no example value: add it to rec.ids", id)
	return ex
}

func (n *exNormaliser) replaceIDs(s string) string {
	return exUUID.ReplaceAllStringFunc(s, n.id)
}

func (n *exNormaliser) header(name, value string, keyCreated time.Time) string {
	if name != idempotency.HeaderKeyExpires {
		return n.replaceIDs(value)
	}
	expires, err := http.ParseTime(value)
	require.NoError(n.t, err)
	// The header has whole seconds: the key's life, rounded up, is the TTL.
	life := (expires.Sub(keyCreated) + time.Second - 1) / time.Second * time.Second
	return n.exampleTime(keyCreated).Add(life).UTC().Format(http.TimeFormat)
}
