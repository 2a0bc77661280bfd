package models_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// acmeWorkflow creates the organisation Acme (slug acme) and a workflow of
// it, straight in the database, and returns their ids.
func acmeWorkflow(t *testing.T, db *gorm.DB) (org, wf string) {
	t.Helper()
	require.NoError(t, db.Raw(`INSERT INTO organizations (name, slug) VALUES ('Acme', 'acme') RETURNING id`).Scan(&org).Error)
	require.NoError(t, db.Raw(`INSERT INTO workflows (org_id, name) VALUES (?, 'wf') RETURNING id`, org).Scan(&wf).Error)
	return org, wf
}
