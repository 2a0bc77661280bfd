package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/internal/apitest"
	"github.com/valruns/valruns/models"
)

// A page of a list is bounded whatever the tenant stored: runs of nearly
// MAX_BODY_BYTES each (submission and metadata), workflows with schemas as
// large, and findings as many as a run may have still list in at most 100
// items of MaxListItemBytes. The items leave out those fields: reading one
// item gives them.
func TestListAnswersAreBounded(t *testing.T) {
	t.Parallel()
	e := apitest.New(t)
	org := e.NewOrg("Acme")
	const page = 100 * handlers.MaxListItemBytes

	big := func(n int) string { return strings.Repeat("x", n) }
	var wfs []string
	for range 3 {
		wfs = append(wfs, e.NewWorkflow(org, map[string]any{"name": "big",
			"schema": map[string]any{"description": big(700 << 10)}}))
	}
	var runs []string
	for i := range 4 {
		run := startRun(t, e, org, wfs[0], map[string]any{
			"submission": map[string]any{"blob": big(600 << 10)},
			"metadata":   map[string]any{"note": big(300 << 10)},
		})
		runs = append(runs, run.ID)
		if i%2 == 0 {
			continue
		}
		// Finished, with as many findings of full size as a run keeps.
		fs := make([]models.Finding, 100)
		for j := range fs {
			fs[j] = models.Finding{Step: "schema", Severity: "error", Path: "/" + big(1990), Message: big(3990)}
		}
		rs := models.NewRunStore(e.DB)
		c, err := rs.Claim(context.Background(), run.ID, time.Minute, 5)
		require.NoError(t, err)
		ok, err := rs.Finish(context.Background(), run.ID, c.Attempts, models.RunFailed, fs)
		require.NoError(t, err)
		require.True(t, ok)
	}

	for _, path := range []string{"/api/runs/?limit=100", "/api/runs/?limit=100&workflow_id=" + wfs[0],
		"/api/runs/?limit=100&status=queued", "/api/runs/?limit=100&status=failed", "/api/workflows/?limit=100"} {
		r := e.Do(http.MethodGet, path, org.Token, nil)
		require.Equal(t, http.StatusOK, r.Status, "%s: %s", path, r.Body)
		require.LessOrEqual(t, len(r.Body), page, "%s: the answer is within the page bound", path)
		var out struct{ Data []map[string]json.RawMessage }
		r.JSON(t, &out)
		require.NotEmpty(t, out.Data, path)
		for _, item := range out.Data {
			for _, field := range []string{"submission", "metadata", "findings", "schema", "assertions"} {
				require.NotContains(t, item, field, "%s: a list item leaves %s out", path, field)
			}
		}
	}

	// Reading one item gives what the list left out.
	r := e.Do(http.MethodGet, "/api/runs/"+runs[1]+"/", org.Token, nil)
	require.Equal(t, http.StatusOK, r.Status)
	run := r.Map(t)
	require.Contains(t, run, "submission")
	require.Contains(t, run, "metadata")
	require.Len(t, run["findings"], 100)
	r = e.Do(http.MethodGet, "/api/workflows/"+wfs[0]+"/", org.Token, nil)
	require.Equal(t, http.StatusOK, r.Status)
	require.Contains(t, r.Map(t), "schema")
}

// Every kind of list item, each of its strings at the most characters the
// database lets it hold and each character one that JSON escapes to six
// bytes, encodes within MaxListItemBytes (as gin's PureJSON encodes it).
func TestListItemsAtTheirLargest(t *testing.T) {
	t.Parallel()
	worst := func(n int) string { return strings.Repeat("\x01", n) }
	ptr := func(s string) *string { return &s }
	now := time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC) // the API writes times in UTC
	code := 599
	id := "5b0f6b8e-3f7c-4d2a-9a57-3b2f4c1d0e9a"
	items := map[string]any{
		"run": handlers.RunSummary{ID: id, WorkflowID: id, Status: models.RunRunning, Error: ptr(worst(2000)),
			Attempts: 1 << 31, CreatedAt: now, StartedAt: &now, FinishedAt: &now},
		"workflow": handlers.WorkflowSummary{ID: id, Name: worst(200), CreatedAt: now},
		"webhook endpoint": handlers.WebhookEndpoint{ID: id, URL: worst(2048), Description: worst(500),
			Events: []string{"validation_run.finished"}, PreviousSecretExpiresAt: &now, CreatedAt: now},
		"webhook delivery": handlers.WebhookDelivery{ID: id, EventID: "evt_" + strings.Repeat("f", 32),
			EventType: "validation_run.finished", RunID: &id, Status: models.DeliveryDelivered, Attempts: 1 << 31,
			LastStatusCode: &code, LastError: ptr(worst(1000)), NextAttemptAt: &now, CreatedAt: now, DeliveredAt: &now},
	}
	for name, item := range items {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(item))
		require.LessOrEqual(t, b.Len(), handlers.MaxListItemBytes, "%s: %d bytes", name, b.Len())
	}
}
