package models_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// Finished answers, in one statement, which of the runs asked about are
// final: passed, failed and error are; queued and running are not, and an
// id no run has is not either.
func TestFinished(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	runs := models.NewRunStore(db)
	org, wf := acmeWorkflow(t, db)
	ids := map[string]string{}
	for _, status := range []string{"queued", "running", "passed", "failed", "error"} {
		var id string
		// A final run has its end time, and an error run its reason.
		require.NoError(t, db.Raw(`INSERT INTO validation_runs (org_id, workflow_id, status, submission, metadata, finished_at, error)
			VALUES (?, ?, ?, '{}', '{}', CASE WHEN ? IN ('queued', 'running') THEN NULL ELSE now() END,
				CASE WHEN ? = 'error' THEN 'worker failed' END) RETURNING id`, org, wf, status, status, status).Scan(&id).Error)
		ids[status] = id
	}
	all := []string{uuid.NewString()}
	for _, id := range ids {
		all = append(all, id)
	}
	got, err := runs.Finished(ctx, all)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{ids["passed"], ids["failed"], ids["error"]}, got)

	got, err = runs.Finished(ctx, []string{ids["queued"]})
	require.NoError(t, err)
	require.Empty(t, got)
	got, err = runs.Finished(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, got)
}
