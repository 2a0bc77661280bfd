package models

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// SecretPrefix starts every webhook signing secret (Standard Webhooks).
const SecretPrefix = "whsec_"

// SecretBytes is how many random bytes a signing secret holds (the Standard
// Webhooks specification asks for 24 to 64).
const SecretBytes = 32

// SecretOverlap is how long a rotated-out secret keeps signing beside the
// new one, so receivers can switch without missing a delivery.
const SecretOverlap = 24 * time.Hour

// WebhookEndpoint is a URL an organisation wants events POSTed to.
type WebhookEndpoint struct {
	ID          string `gorm:"primaryKey;type:uuid;default:gen_random_uuid()"`
	OrgID       string
	URL         string `gorm:"column:url"`
	Description string
	// Events is the JSON array of the event types delivered.
	Events JSON `gorm:"type:jsonb"`
	// Secret is "whsec_" + base64 of the signing key.
	Secret string
	// PreviousSecret, until PreviousSecretExpiresAt, signs beside Secret.
	PreviousSecret          *string
	PreviousSecretExpiresAt *time.Time
	CreatedAt               time.Time `gorm:"default:now()"`
}

// SigningSecrets are the secrets that sign a delivery at now: the current
// one, and the one it replaced while its overlap lasts.
func (e *WebhookEndpoint) SigningSecrets(now time.Time) []string {
	out := []string{e.Secret}
	if e.PreviousSecret != nil && e.PreviousSecretExpiresAt != nil && now.Before(*e.PreviousSecretExpiresAt) {
		out = append(out, *e.PreviousSecret)
	}
	return out
}

// NewWebhookSecret returns a new signing secret: "whsec_" + base64 of
// SecretBytes random bytes.
func NewWebhookSecret() (string, error) {
	b := make([]byte, SecretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("webhook secret: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

// WebhookStore reads and writes webhook endpoints, always within one organisation.
type WebhookStore struct{ db *gorm.DB }

// NewWebhookStore returns a WebhookStore on db.
func NewWebhookStore(db *gorm.DB) *WebhookStore { return &WebhookStore{db: db} }

// Create inserts e on tx (the request's transaction), filling ID and CreatedAt.
func (s *WebhookStore) Create(tx *gorm.DB, e *WebhookEndpoint) error {
	if err := tx.Create(e).Error; err != nil {
		return fmt.Errorf("create webhook endpoint: %w", translate(err))
	}
	return nil
}

// Get reads one endpoint of the organisation; another organisation's is ErrNotFound.
func (s *WebhookStore) Get(ctx context.Context, orgID, id string) (*WebhookEndpoint, error) {
	var e WebhookEndpoint
	if err := s.db.WithContext(ctx).Where("id = ? AND org_id = ?", id, orgID).Take(&e).Error; err != nil {
		return nil, fmt.Errorf("webhook endpoint %s: %w", id, translate(err))
	}
	return &e, nil
}

// List returns one page of the organisation's endpoints, newest first, and
// the cursor of the next page ("" on the last one).
func (s *WebhookStore) List(ctx context.Context, orgID string, p Page) ([]WebhookEndpoint, string, error) {
	es, next, err := listPage(s.db.WithContext(ctx).Where("org_id = ?", orgID), p,
		func(e *WebhookEndpoint) (time.Time, string) { return e.CreatedAt, e.ID })
	if err != nil {
		return nil, "", fmt.Errorf("list webhook endpoints: %w", err)
	}
	return es, next, nil
}

// Delete removes one endpoint of the organisation; another organisation's,
// or one already deleted, is ErrNotFound.
func (s *WebhookStore) Delete(ctx context.Context, orgID, id string) error {
	res := s.db.WithContext(ctx).Where("id = ? AND org_id = ?", id, orgID).Delete(&WebhookEndpoint{})
	if res.Error != nil {
		return fmt.Errorf("delete webhook endpoint %s: %w", id, translate(res.Error))
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("webhook endpoint %s: %w", id, ErrNotFound)
	}
	return nil
}

// RotateSecret gives the endpoint the secret next, in one statement: the
// current secret becomes the previous one, signing beside next until
// SecretOverlap from now (a secret rotated out earlier stops at once).
// It returns the endpoint as it now is.
func (s *WebhookStore) RotateSecret(ctx context.Context, orgID, id, next string) (*WebhookEndpoint, error) {
	var rows []WebhookEndpoint
	err := s.db.WithContext(ctx).Model(&rows).Clauses(clause.Returning{}).
		Where("id = ? AND org_id = ?", id, orgID).
		Updates(map[string]any{
			"previous_secret":            gorm.Expr("secret"),
			"previous_secret_expires_at": gorm.Expr("now() + ?::interval", fmt.Sprintf("%d seconds", int64(SecretOverlap/time.Second))),
			"secret":                     next,
		}).Error
	if err != nil {
		return nil, fmt.Errorf("rotate webhook secret %s: %w", id, translate(err))
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("webhook endpoint %s: %w", id, ErrNotFound)
	}
	return &rows[0], nil
}

// WebhookDelivery is the delivery of one event to one endpoint (the outbox
// row recorded with the run's final state).
type WebhookDelivery struct {
	ID         string `gorm:"primaryKey;type:uuid;default:gen_random_uuid()"`
	OrgID      string
	EndpointID string
	RunID      string
	// EventID is the webhook-id of every attempt: evt_ + the run id's hex.
	EventID   string
	EventType string
	// Status is pending, delivered or failed.
	Status         string
	Attempts       int
	NextAttemptAt  *time.Time
	LastStatusCode *int
	LastError      *string
	CreatedAt      time.Time `gorm:"default:now()"`
	DeliveredAt    *time.Time
}

// Deliveries returns one page of an endpoint's deliveries, newest first,
// and the cursor of the next page; ErrNotFound when the organisation has no
// such endpoint.
func (s *WebhookStore) Deliveries(ctx context.Context, orgID, endpointID string, p Page) ([]WebhookDelivery, string, error) {
	if _, err := s.Get(ctx, orgID, endpointID); err != nil {
		return nil, "", err
	}
	ds, next, err := listPage(s.db.WithContext(ctx).Where("endpoint_id = ? AND org_id = ?", endpointID, orgID), p,
		func(d *WebhookDelivery) (time.Time, string) { return d.CreatedAt, d.ID })
	if err != nil {
		return nil, "", fmt.Errorf("list webhook deliveries: %w", err)
	}
	return ds, next, nil
}
