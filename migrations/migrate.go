package migrations

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// NewProvider returns a goose provider applying FS to db. goose takes a
// PostgreSQL advisory lock of its own while it migrates, so two processes
// starting with MIGRATE_ON_START=true do not race.
func NewProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Pending reports how many migrations are not applied yet.
func Pending(ctx context.Context, db *sql.DB) (int, error) {
	p, err := NewProvider(db)
	if err != nil {
		return 0, err
	}
	st, err := p.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("migration status: %w", err)
	}
	n := 0
	for _, s := range st {
		if s.State == goose.StatePending {
			n++
		}
	}
	return n, nil
}
