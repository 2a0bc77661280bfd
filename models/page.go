package models

import (
	"time"

	"gorm.io/gorm"
)

// Page asks for one page of a newest-first listing.
type Page struct {
	// Limit is the page size (1-100); 0 means 20.
	Limit int
	// After is where the page starts: the position of the previous page's
	// last item (nil: the first page). Its ID is a canonical UUID: the
	// handlers read it from a client's cursor, checked, at the edge.
	After *Position
}

// Position is a row's place in a newest-first listing: its creation time,
// then its id to break ties.
type Position struct {
	CreatedAt time.Time
	ID        string
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

// after narrows q to the rows after the page's start.
func (p Page) after(q *gorm.DB) *gorm.DB {
	if p.After == nil {
		return q
	}
	return q.Where("(created_at, id) < (?, ?)", p.After.CreatedAt, p.After.ID)
}

// listPage runs q (already filtered to what the caller may see) for one page
// newest first, by (created_at, id), and returns the rows and the next
// page's start (nil on the last page). key gives a row's position.
func listPage[T any](q *gorm.DB, p Page, key func(*T) Position) ([]T, *Position, error) {
	var rows []T
	if err := p.after(q).Order("created_at DESC, id DESC").Limit(p.limit() + 1).Find(&rows).Error; err != nil {
		return nil, nil, translate(err)
	}
	if len(rows) <= p.limit() {
		return rows, nil, nil
	}
	rows = rows[:p.limit()]
	next := key(&rows[len(rows)-1])
	return rows, &next, nil
}
