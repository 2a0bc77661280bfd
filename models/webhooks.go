package models

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
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
// where the next page starts (nil on the last one).
func (s *WebhookStore) List(ctx context.Context, orgID string, p Page) ([]WebhookEndpoint, *Position, error) {
	es, next, err := listPage(s.db.WithContext(ctx).Where("org_id = ?", orgID), p,
		func(e *WebhookEndpoint) Position { return Position{e.CreatedAt, e.ID} })
	if err != nil {
		return nil, nil, fmt.Errorf("list webhook endpoints: %w", err)
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
// It runs on tx (the request's transaction) and returns the endpoint as it
// now is.
func (s *WebhookStore) RotateSecret(tx *gorm.DB, orgID, id, next string) (*WebhookEndpoint, error) {
	var rows []WebhookEndpoint
	err := tx.Model(&rows).Clauses(clause.Returning{}).
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

// EventTest is the type of a test event (SendTestEvent): about no run,
// sent to an endpoint whatever it subscribes to, attempted once.
const EventTest = "webhook.test"

// A delivery's statuses.
const (
	// DeliveryPending: not yet delivered; attempts go on.
	DeliveryPending = "pending"
	// DeliveryDelivered: an attempt got a 2xx answer.
	DeliveryDelivered = "delivered"
	// DeliveryFailed: given up, its horizon passed without a 2xx answer.
	DeliveryFailed = "failed"
)

// WebhookDelivery is the delivery of one event to one endpoint (the outbox
// row recorded with the run's final state).
type WebhookDelivery struct {
	ID         string `gorm:"primaryKey;type:uuid;default:gen_random_uuid()"`
	OrgID      string
	EndpointID string
	// RunID is the run the event is about; nil for a test event.
	RunID *string
	// EventID is the webhook-id of every attempt: evt_ + the run id's hex
	// (a test event: evt_ + a new id's hex).
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
// and where the next page starts (nil on the last one); ErrNotFound when
// the organisation has no such endpoint.
func (s *WebhookStore) Deliveries(ctx context.Context, orgID, endpointID string, p Page) ([]WebhookDelivery, *Position, error) {
	if _, err := s.Get(ctx, orgID, endpointID); err != nil {
		return nil, nil, err
	}
	ds, next, err := listPage(s.db.WithContext(ctx).Where("endpoint_id = ? AND org_id = ?", endpointID, orgID), p,
		func(d *WebhookDelivery) Position { return Position{d.CreatedAt, d.ID} })
	if err != nil {
		return nil, nil, fmt.Errorf("list webhook deliveries: %w", err)
	}
	return ds, next, nil
}

// Redeliver makes the organisation's delivery id of the endpoint due again
// at once, on tx (the request's transaction), whatever its status
// (delivered, failed, pending), and returns it as it now is: pending, its
// next attempt due now. The attempt is a new one of the same event (the
// same event id, so the same webhook-id). When an attempt of it is under
// way (a live claim), that attempt is left alone, so the event is never
// sent twice at once: its outcome then leaves the delivery due at once
// (resend, RecordAttempt), unless a newer claim's attempt came first.
// Another organisation's delivery, or another endpoint's, is ErrNotFound.
//
// A delivery given up past WEBHOOK_RETRY_HORIZON gets this one attempt:
// failed again if it is not delivered.
func (s *WebhookStore) Redeliver(tx *gorm.DB, orgID, endpointID, id string) (*WebhookDelivery, error) {
	var rows []WebhookDelivery
	err := tx.Raw(redeliverSQL, id, endpointID, orgID).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("redeliver webhook delivery %s: %w", id, translate(err))
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("webhook delivery %s: %w", id, ErrNotFound)
	}
	return &rows[0], nil
}

// The deliveries' statements longer than a line, each in sql/ under its
// name. record_attempt.sql names EventTest by its value.
var (
	redeliverSQL            = statement("redeliver")
	claimDueDeliveriesSQL   = statement("claim_due_deliveries")
	recordAttemptSQL        = statement("record_attempt")
	deleteDoneDeliveriesSQL = statement("delete_done_deliveries")
)

// SendTestEvent records a test event (EventTest) for the organisation's
// endpoint, on tx (the request's transaction): a delivery due at once,
// attempted once, whatever the endpoint subscribes to. At most maxPending
// test events of one endpoint wait for their attempt at once (past that,
// ErrTestsPending): a tenant cannot queue test events without bound. The
// endpoint's row is locked FOR NO KEY UPDATE meanwhile, so two requests
// count in turn; it does not hold up the runs' ends, whose deliveries only
// take FOR KEY SHARE on it. Another organisation's endpoint is ErrNotFound.
func (s *WebhookStore) SendTestEvent(tx *gorm.DB, orgID, endpointID string, maxPending int) (*WebhookDelivery, error) {
	var ids []string
	if err := tx.Raw(`SELECT id FROM webhook_endpoints WHERE id = ? AND org_id = ? FOR NO KEY UPDATE`, endpointID, orgID).
		Scan(&ids).Error; err != nil {
		return nil, fmt.Errorf("test event: %w", translate(err))
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("webhook endpoint %s: %w", endpointID, ErrNotFound)
	}
	var n int64
	if err := tx.Raw(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = ? AND status = 'pending' AND event_type = ?`,
		endpointID, EventTest).Scan(&n).Error; err != nil {
		return nil, fmt.Errorf("test event: %w", translate(err))
	}
	if n >= int64(maxPending) {
		return nil, fmt.Errorf("webhook endpoint %s: %d test events pending: %w", endpointID, n, ErrTestsPending)
	}
	var rows []WebhookDelivery
	err := tx.Raw(`INSERT INTO webhook_deliveries (org_id, endpoint_id, event_id, event_type) VALUES (?, ?, ?, ?) RETURNING *`,
		orgID, endpointID, "evt_"+strings.ReplaceAll(NewRunID(), "-", ""), EventTest).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("test event: %w", translate(err))
	}
	return &rows[0], nil
}

// DeliveryClaim is a due delivery a worker claimed for one attempt.
type DeliveryClaim struct {
	ID string
	// Attempts is how many attempts it had before this one.
	Attempts int
	// Claim is when the claim runs out (the delivery's sending_until, to
	// the microsecond): it names this claim, since the next claim of the
	// delivery ends later. Its attempt reads and records the delivery only
	// while this is still its claim (DeliveryJob, RecordAttempt).
	Claim time.Time
}

// ClaimDueDeliveries claims up to limit pending deliveries whose next
// attempt is due and that no attempt is under way for, for lease: until
// then no other worker claims them (past it, a claim whose attempt never
// recorded its outcome, the worker having died or Redis having lost the
// task, is due again). Fair by endpoint: it claims the oldest due
// deliveries of each endpoint in turn, and at most perEndpoint attempts of
// one endpoint are under way at once, counting those already under way (a
// slow or dead endpoint holds at most that many senders, not all of them).
// Two workers claiming at once may each claim up to perEndpoint.
func (s *WebhookStore) ClaimDueDeliveries(ctx context.Context, limit, perEndpoint int, lease time.Duration) ([]DeliveryClaim, error) {
	var out []DeliveryClaim
	err := s.db.WithContext(ctx).Raw(claimDueDeliveriesSQL,
		map[string]any{"limit": limit, "per": perEndpoint, "lease": lease.Microseconds()}).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("claim webhook deliveries: %w", translate(err))
	}
	return out, nil
}

// DeliveryJob is what one attempt of a delivery needs.
type DeliveryJob struct {
	Delivery WebhookDelivery
	Endpoint WebhookEndpoint
	// Run is the run the event is about, as final as it will ever be; nil
	// for a test event (EventTest).
	Run *ValidationRun
}

// DeliveryJob reads what the attempt of the delivery id under claim needs;
// ErrNotFound when there is nothing left for it to attempt: the delivery
// was delivered or failed meanwhile, its endpoint was deleted (and its
// deliveries with it), or claim ran out and the delivery was claimed again
// (the newer claim's attempt sends it).
func (s *WebhookStore) DeliveryJob(ctx context.Context, id string, claim time.Time) (*DeliveryJob, error) {
	var j DeliveryJob
	db := s.db.WithContext(ctx)
	if err := db.Where("id = ? AND status = 'pending' AND sending_until = ?", id, claim).Take(&j.Delivery).Error; err != nil {
		return nil, fmt.Errorf("webhook delivery %s: %w", id, translate(err))
	}
	if err := db.Where("id = ?", j.Delivery.EndpointID).Take(&j.Endpoint).Error; err != nil {
		return nil, fmt.Errorf("webhook delivery %s: endpoint: %w", id, translate(err))
	}
	if j.Delivery.RunID == nil {
		return &j, nil // a test event
	}
	j.Run = &ValidationRun{}
	if err := db.Where("id = ?", *j.Delivery.RunID).Take(j.Run).Error; err != nil {
		return nil, fmt.Errorf("webhook delivery %s: run: %w", id, translate(err))
	}
	return &j, nil
}

// Attempt is the outcome of one attempt of a delivery.
type Attempt struct {
	// Delivered: the endpoint answered 2xx.
	Delivered bool
	// StatusCode is the answer's status, 0 when there was none.
	StatusCode int
	// Error says why there was no answer, "" if there was one.
	Error string
	// Retry is when to try again if it was not delivered: from now, unless
	// that is past the delivery's horizon (then it failed for good).
	Retry time.Duration
}

// RecordAttempt writes the outcome of the attempt made under claim:
// delivered; or pending, with its next attempt due after a.Retry; or
// failed, when that would be more than horizon after the event, or when it
// is a test event's (one attempt, no retries). A redelivery asked while the
// attempt was under way (Redeliver: resend) makes it pending and due at
// once, whatever the outcome. It returns
// the delivery's status, "" when it wrote nothing: the delivery is no
// longer pending, or claim is no longer its claim (it ran out and the
// delivery was claimed again: a late attempt never records over a newer
// claim). A claim that ran out and was not taken again still records.
func (s *WebhookStore) RecordAttempt(ctx context.Context, id string, claim time.Time, a Attempt, horizon time.Duration) (string, error) {
	var code *int
	if a.StatusCode != 0 {
		code = &a.StatusCode
	}
	var msg *string
	if a.Error != "" {
		e := truncate(a.Error, 1000)
		msg = &e
	}
	var status []string
	err := s.db.WithContext(ctx).Raw(recordAttemptSQL, map[string]any{"id": id, "claim": claim, "code": code, "msg": msg, "delivered": a.Delivered,
		"retry": a.Retry.Microseconds(), "horizon": horizon.Microseconds()}).Scan(&status).Error
	if err != nil {
		return "", fmt.Errorf("record webhook delivery %s: %w", id, translate(err))
	}
	if len(status) == 0 {
		return "", nil
	}
	return status[0], nil
}

// OldestPendingDelivery is when the oldest pending delivery's event
// happened; ok is false when none is pending.
func (s *WebhookStore) OldestPendingDelivery(ctx context.Context) (t time.Time, ok bool, err error) {
	var ts []time.Time
	if err := s.db.WithContext(ctx).Raw(`SELECT created_at FROM webhook_deliveries WHERE status = 'pending' ORDER BY created_at LIMIT 1`).
		Scan(&ts).Error; err != nil {
		return time.Time{}, false, fmt.Errorf("oldest pending webhook delivery: %w", translate(err))
	}
	if len(ts) == 0 {
		return time.Time{}, false, nil
	}
	return ts[0], true, nil
}

// DeleteDoneDeliveries deletes the deliveries delivered or failed whose
// event is older than before, batch per statement, until none remain, and
// returns how many it deleted. Pending ones are kept, however old.
func (s *WebhookStore) DeleteDoneDeliveries(ctx context.Context, before time.Time, batch int) (int64, error) {
	var total int64
	for {
		res := s.db.WithContext(ctx).Exec(deleteDoneDeliveriesSQL, before, batch)
		total += res.RowsAffected
		if res.Error != nil {
			return total, fmt.Errorf("delete old webhook deliveries: %w", translate(res.Error))
		}
		if res.RowsAffected == 0 {
			return total, nil
		}
	}
}
