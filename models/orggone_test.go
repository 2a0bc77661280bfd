package models_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/testdb"
	"github.com/valruns/valruns/models"
)

// Every foreign key to organizations is one translate reads as
// ErrOrgGone, so a table added later cannot turn a deleted organisation
// back into a 500.
func TestOrgForeignKeysAreTheSchemas(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	var inSchema []string
	require.NoError(t, db.Raw(`SELECT conname FROM pg_constraint
		WHERE contype = 'f' AND confrelid = 'organizations'::regclass ORDER BY conname`).Scan(&inSchema).Error)
	var known []string
	for name := range models.OrgForeignKeysForTest {
		known = append(known, name)
	}
	slices.Sort(known)
	require.Equal(t, inSchema, known)
}

// Writes and reads for an organisation that no longer exists are
// ErrOrgGone, not an error of the database.
func TestOrgGone(t *testing.T) {
	t.Parallel()
	db, _ := testdb.New(t)
	ctx := context.Background()
	gone := models.NewRunID() // no such organisation

	err := models.NewWorkflowStore(db).Create(db, &models.Workflow{OrgID: gone, Name: "wf", Assertions: []byte(`[]`)})
	require.ErrorIs(t, err, models.ErrOrgGone)
	err = models.NewWebhookStore(db).Create(db, &models.WebhookEndpoint{OrgID: gone, URL: "https://example.com/", Events: []byte(`["validation_run.finished"]`), Secret: "whsec_x"})
	require.ErrorIs(t, err, models.ErrOrgGone)
	_, err = models.NewUsageStore(db).Get(ctx, gone, 0, time.Now())
	require.ErrorIs(t, err, models.ErrOrgGone)

	tx, _, err := models.BeginRequest(ctx, db, 10*time.Second, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	err = models.NewRunStore(db).Start(tx, models.StartParams{ID: models.NewRunID(), CreatedAt: time.Now(),
		OrgID: gone, WorkflowID: models.NewRunID(), Submission: []byte(`{}`)})
	require.ErrorIs(t, err, models.ErrOrgGone, "its workflows went with it")
}
