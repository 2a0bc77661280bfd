package models_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// A list page reads none of the columns whose size a client chose: a page
// of runs no submission, metadata or findings, a page of workflows no
// schema or assertions, whichever way the page is read.
func TestListsReadNoLargeColumns(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	var org, wf string
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&org).Error)
	require.NoError(t, db.Raw(`INSERT INTO workflows (org_id, name, schema, assertions)
		VALUES (?, 'wf', '{"type":"object"}', '[{"name":"a","expr":"true"}]') RETURNING id`, org).Scan(&wf).Error)

	runs := models.NewRunStore(db)
	var ids []string
	for range 2 {
		tx, _, err := models.BeginRequest(ctx, db, 10*time.Second, nil)
		require.NoError(t, err)
		id := models.NewRunID()
		require.NoError(t, runs.Start(tx, models.StartParams{ID: id, CreatedAt: models.NewRunTime(), OrgID: org, WorkflowID: wf,
			Submission: []byte(`{"big":"x"}`), Metadata: []byte(`{"note":"y"}`)}))
		_, err = tx.Commit(ctx, nil)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	c, err := runs.Claim(ctx, ids[0], time.Minute, 5)
	require.NoError(t, err)
	ok, err := runs.Finish(ctx, ids[0], c.Attempts, models.RunFailed, []models.Finding{{Step: "schema", Severity: "error", Message: "m"}})
	require.NoError(t, err)
	require.True(t, ok)

	for _, status := range []string{"", models.RunQueued, models.RunFailed} {
		rs, _, err := runs.List(ctx, org, models.RunFilter{Status: status}, models.Page{})
		require.NoError(t, err)
		require.NotEmpty(t, rs, "status %q", status)
		for _, r := range rs {
			require.NotEmpty(t, r.ID)
			require.Equal(t, wf, r.WorkflowID)
			require.False(t, r.CreatedAt.IsZero())
			require.Nil(t, r.Submission, "status %q", status)
			require.Nil(t, r.Metadata, "status %q", status)
			require.Nil(t, r.Findings, "status %q", status)
		}
	}
	full, err := runs.Get(ctx, org, ids[0])
	require.NoError(t, err)
	require.NotNil(t, full.Submission, "Get reads the run whole")
	require.NotNil(t, full.Findings)

	ws, _, err := models.NewWorkflowStore(db).List(ctx, org, models.Page{})
	require.NoError(t, err)
	require.Len(t, ws, 1)
	require.Equal(t, "wf", ws[0].Name)
	require.Nil(t, ws[0].Schema)
	require.Nil(t, ws[0].Assertions)
}
