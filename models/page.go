package models

import (
	"encoding/base64"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

// Page asks for one page of a newest-first listing.
type Page struct {
	// Limit is the page size (1-100); 0 means 20.
	Limit int
	// Cursor is the opaque next_cursor of the previous page; "" is the first page.
	Cursor string
}

// ErrBadCursor: the cursor was not produced by this service.
var ErrBadCursor = errors.New("invalid cursor")

// keyset is the position after which the next page starts.
type keyset struct {
	createdAt time.Time
	id        string
}

func (p Page) limit() int {
	switch {
	case p.Limit <= 0:
		return 20
	case p.Limit > 100:
		return 100
	}
	return p.Limit
}

func (p Page) after() (*keyset, error) {
	if p.Cursor == "" {
		return nil, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(p.Cursor)
	if err != nil {
		return nil, ErrBadCursor
	}
	ts, id, ok := strings.Cut(string(raw), "|")
	if !ok {
		return nil, ErrBadCursor
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return nil, ErrBadCursor
	}
	if _, err := uuid.Parse(id); err != nil {
		return nil, ErrBadCursor
	}
	return &keyset{createdAt: t, id: id}, nil
}

func cursorOf(createdAt time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(createdAt.UTC().Format(time.RFC3339Nano) + "|" + id))
}

// listPage runs q (already filtered to what the caller may see) for one page
// newest first, by (created_at, id), and returns the rows and the next
// page's cursor ("" on the last page). key gives a row's position.
func listPage[T any](q *gorm.DB, p Page, key func(*T) (time.Time, string)) ([]T, string, error) {
	after, err := p.after()
	if err != nil {
		return nil, "", err
	}
	if after != nil {
		q = q.Where("(created_at, id) < (?, ?)", after.createdAt, after.id)
	}
	var rows []T
	if err := q.Order("created_at DESC, id DESC").Limit(p.limit() + 1).Find(&rows).Error; err != nil {
		return nil, "", translate(err)
	}
	if len(rows) <= p.limit() {
		return rows, "", nil
	}
	rows = rows[:p.limit()]
	return rows, cursorOf(key(&rows[len(rows)-1])), nil
}
