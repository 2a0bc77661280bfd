package models

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// WorkflowStore reads and writes workflows, always within one organisation.
type WorkflowStore struct{ db *gorm.DB }

// NewWorkflowStore returns a WorkflowStore on db.
func NewWorkflowStore(db *gorm.DB) *WorkflowStore { return &WorkflowStore{db: db} }

// Create inserts w on tx (the request's transaction), filling ID and CreatedAt.
func (s *WorkflowStore) Create(tx *gorm.DB, w *Workflow) error {
	if err := tx.Create(w).Error; err != nil {
		return fmt.Errorf("create workflow: %w", translate(err))
	}
	return nil
}

// Get reads one workflow of the organisation; another organisation's is ErrNotFound.
func (s *WorkflowStore) Get(ctx context.Context, orgID, id string) (*Workflow, error) {
	var w Workflow
	if err := s.db.WithContext(ctx).Where("id = ? AND org_id = ?", id, orgID).Take(&w).Error; err != nil {
		return nil, fmt.Errorf("workflow %s: %w", id, translate(err))
	}
	return &w, nil
}

// List returns one page of the organisation's workflows, newest first, and
// where the next page starts (nil on the last one). The workflows are read
// without their schema and assertions (nil), whose size a client chose, so
// that a page costs the same memory whatever they hold: Get reads them.
func (s *WorkflowStore) List(ctx context.Context, orgID string, p Page) ([]Workflow, *Position, error) {
	q := s.db.WithContext(ctx).Select("id", "name", "created_at").Where("org_id = ?", orgID)
	ws, next, err := listPage(q, p,
		func(w *Workflow) Position { return Position{w.CreatedAt, w.ID} })
	if err != nil {
		return nil, nil, fmt.Errorf("list workflows: %w", err)
	}
	return ws, next, nil
}

// ByName finds the organisation's newest workflow with that name.
func (s *WorkflowStore) ByName(ctx context.Context, orgID, name string) (*Workflow, error) {
	var w Workflow
	err := s.db.WithContext(ctx).Where("org_id = ? AND name = ?", orgID, name).Order("created_at DESC").Take(&w).Error
	if err != nil {
		return nil, fmt.Errorf("workflow %q: %w", name, translate(err))
	}
	return &w, nil
}
