package client

import (
	"context"
	"errors"
	"iter"
	"net/url"
	"time"
)

// Event types of webhook deliveries.
const (
	// EventRunFinished: a run reached passed, failed or error.
	EventRunFinished = "validation_run.finished"
	// EventTest: a test event (SendWebhookTest), about no run.
	EventTest = "webhook.test"
)

// Statuses of a webhook delivery.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// WebhookDelivery is the delivery of one event to one webhook endpoint.
type WebhookDelivery struct {
	ID string `json:"id"`
	// EventID is the event's id, sent as webhook-id on every attempt.
	EventID string `json:"event_id"`
	// EventType is EventRunFinished or EventTest.
	EventType string `json:"event_type"`
	// RunID is the run the event is about; "" for a test event.
	RunID string `json:"run_id,omitempty"`
	// Status is DeliveryPending, DeliveryDelivered or DeliveryFailed.
	Status   string `json:"status"`
	Attempts int    `json:"attempts"`
	// LastStatusCode is the status of the last attempt's answer; nil when
	// it had none.
	LastStatusCode *int `json:"last_status_code,omitempty"`
	// LastError says, coarsely, why the last attempt failed.
	LastError *string `json:"last_error,omitempty"`
	// NextAttemptAt is when the next attempt is due, while pending.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	DeliveredAt   *time.Time `json:"delivered_at,omitempty"`
}

// DeliveryResult is the answer to RedeliverWebhook and SendWebhookTest.
type DeliveryResult struct {
	// Delivery is the delivery, due now (pending), as the first request
	// with the call's key left it.
	Delivery WebhookDelivery
	// Replayed is true when the answer was the stored answer of an earlier
	// request with the same key (nothing was asked for again).
	Replayed bool
	// Key is the Idempotency-Key the call sent on every attempt.
	Key string
	// RequestID is the X-Request-Id of the answer; OriginalRequestID, on a
	// replay, that of the request that did the work.
	RequestID, OriginalRequestID string
	// Attempts is how many requests the call sent.
	Attempts int
}

// RedeliverWebhook sends a delivery of the endpoint again, whatever its
// status: the server makes it due at once, and a worker makes a new
// attempt of the same event, with the same webhook-id (a receiver that
// handled it drops it). An attempt under way is left to finish first. It
// is idempotent: one key per call (see WithKey), retried like StartRun, so
// a retry never asks for a second attempt. ErrNotFound: no such delivery
// of the endpoint in the organisation.
func (c *Client) RedeliverWebhook(ctx context.Context, endpointID, deliveryID string, opts ...WriteOption) (*DeliveryResult, error) {
	if endpointID == "" || deliveryID == "" {
		return nil, errors.New("valruns: RedeliverWebhook: empty endpoint or delivery id")
	}
	return c.deliveryWrite(ctx, "/api/webhook-endpoints/"+url.PathEscape(endpointID)+"/deliveries/"+url.PathEscape(deliveryID)+"/redeliver/", opts)
}

// SendWebhookTest sends the endpoint a test event (EventTest), signed like
// any event, whatever event types it subscribes to; it is attempted once,
// and its delivery shows whether the receiver answered 2xx
// (ListWebhookDeliveries). Idempotent like RedeliverWebhook.
// ErrTestEventsPending: 5 test events of the endpoint wait for their
// attempt already (not retried); ErrNotFound: no such endpoint.
func (c *Client) SendWebhookTest(ctx context.Context, endpointID string, opts ...WriteOption) (*DeliveryResult, error) {
	if endpointID == "" {
		return nil, errors.New("valruns: SendWebhookTest: empty endpoint id")
	}
	return c.deliveryWrite(ctx, "/api/webhook-endpoints/"+url.PathEscape(endpointID)+"/test/", opts)
}

func (c *Client) deliveryWrite(ctx context.Context, path string, opts []WriteOption) (*DeliveryResult, error) {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	var res DeliveryResult
	w, err := c.write(ctx, path, nil, o, &res.Delivery)
	if err != nil {
		return nil, err
	}
	res.Replayed, res.Key, res.RequestID, res.OriginalRequestID, res.Attempts = w.replayed, w.key, w.requestID, w.originalRequestID, w.attempts
	return &res, nil
}

// ListWebhookDeliveries iterates over an endpoint's deliveries, newest
// first, fetching pages as the loop goes. An error ends the iteration with
// (zero WebhookDelivery, err).
func (c *Client) ListWebhookDeliveries(ctx context.Context, endpointID string, opts ...ListOption) iter.Seq2[WebhookDelivery, error] {
	return list[WebhookDelivery](ctx, c, "/api/webhook-endpoints/"+url.PathEscape(endpointID)+"/deliveries/", url.Values{}, opts)
}
