package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/webhooks"
)

// TypeWebhookDeliver names one attempt of one webhook delivery
// (WebhookPayload) in valruns_tasks_processed_total.
const TypeWebhookDeliver = "webhook:deliver"

// WebhookPayload names one attempt: a delivery and its claim.
type WebhookPayload struct {
	DeliveryID string `json:"delivery_id"`
	// Claim names the claim the attempt is made under: when it runs out,
	// in unix microseconds (models.DeliveryClaim.Claim).
	Claim int64 `json:"claim"`
}

// Defaults of the webhook sender.
const (
	// webhookPerEndpoint bounds the attempts under way to one endpoint per
	// claiming worker.
	webhookPerEndpoint = 4
	// maxWebhookRetry caps the delay between two attempts.
	maxWebhookRetry = 8 * time.Hour
	// oldestPendingEvery is how often the oldest pending delivery's age
	// is read for its gauge.
	oldestPendingEvery = 10 * time.Second
)

// WebhookRetryDelay is the delay after the n-th failed attempt (n >= 1):
// base times 4^(n-1), at most 8 h, jittered down by up to a fifth so that
// the deliveries of an endpoint that was down spread out. With base 5 s:
// 5 s, 20 s, 80 s, 5 min, 21 min, 85 min, 5.7 h, then 8 h: the tenth
// attempt comes about 24 h after the first.
func WebhookRetryDelay(base time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < maxWebhookRetry; i++ {
		d *= 4
	}
	d = min(d, max(base, maxWebhookRetry))
	return d - time.Duration(rand.Int64N(int64(d/5)+1))
}

// webhookSender sends the webhook outbox: its poller claims due deliveries
// (models.WebhookStore.ClaimDueDeliveries), as many as it has free slots,
// and makes one attempt of each in a slot of its own: it sends the event
// (webhooks.Sender) and records the outcome, which schedules the next
// attempt. PostgreSQL says what is left to deliver: a worker killed
// mid-attempt, or an outcome that could not be written, leaves a claim
// that runs out (lease), and the delivery is claimed and attempted again.
// Redis plays no part.
type webhookSender struct {
	store *models.WebhookStore
	send  *webhooks.Sender
	// eventData is the run as the API shows it (handlers' view, injected).
	eventData func(*models.ValidationRun) any
	interval  time.Duration
	limit     int
	base      time.Duration
	horizon   time.Duration
	// lease is how long a claim holds a delivery for its attempt
	// (WEBHOOK_CLAIM_LEASE).
	lease time.Duration
	log   *slog.Logger
	m     *webhookMetrics
	// poke wakes the poller before its interval: a run ended here.
	poke chan struct{}
	// tracer traces each attempt; nil: tracing is off.
	tracer trace.Tracer
	// processed counts the attempts made and recorded.
	processed prometheus.Counter

	mu       sync.Mutex
	inflight int
	attempts sync.WaitGroup
}

type webhookMetrics struct {
	attempts      *prometheus.CounterVec
	oldestPending prometheus.Gauge
}

func newWebhookMetrics(reg prometheus.Registerer) *webhookMetrics {
	m := &webhookMetrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "valruns_webhook_attempts_total",
			Help: "Webhook delivery attempts this worker made, by outcome (delivered: a 2xx answer; retried: no 2xx, another attempt is due; failed: no 2xx and given up, past WEBHOOK_RETRY_HORIZON).",
		}, []string{"outcome"}),
		oldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "valruns_webhook_oldest_pending_seconds",
			Help: "Age of the oldest webhook delivery not yet delivered nor given up (0: none), read every 10 s.",
		}),
	}
	for _, o := range []string{"delivered", "retried", "failed"} {
		m.attempts.WithLabelValues(o)
	}
	reg.MustRegister(m.attempts, m.oldestPending)
	return m
}

// wake makes the poller look for due deliveries now; it never blocks.
func (s *webhookSender) wake() { signal(s.poke) }

// run polls until ctx is done: every interval, and when woken (a run
// ended here), at most every interval/10: a stream of ending runs costs at
// most ten claims a second. After a full claim it looks again at that pace.
func (s *webhookSender) run(ctx context.Context) {
	gap := s.interval / 10
	var lastOldest time.Time
	for {
		began := time.Now()
		n, err := s.dispatch(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "could not claim due webhook deliveries", "error", err)
		}
		if time.Since(lastOldest) >= oldestPendingEvery {
			lastOldest = time.Now()
			s.readOldest(ctx)
		}
		wait := s.interval
		if n > 0 {
			wait = gap
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-s.poke:
			t.Stop()
			if !sleepCtx(ctx, gap-time.Since(began)) {
				return
			}
		}
	}
}

// sleepCtx sleeps for d (nothing if d <= 0); false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (s *webhookSender) readOldest(ctx context.Context) {
	oldest, ok, err := s.store.OldestPendingDelivery(ctx)
	switch {
	case err != nil:
		return
	case !ok:
		s.m.oldestPending.Set(0)
	default:
		s.m.oldestPending.Set(time.Since(oldest).Seconds())
	}
}

// dispatch claims the deliveries due, as many as it has free slots, and
// starts an attempt of each. It returns how many it claimed.
func (s *webhookSender) dispatch(ctx context.Context) (int, error) {
	s.mu.Lock()
	free := s.limit - s.inflight
	s.mu.Unlock()
	if free <= 0 {
		return 0, nil
	}
	claims, err := s.store.ClaimDueDeliveries(ctx, free, webhookPerEndpoint, s.lease)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.inflight += len(claims)
	s.mu.Unlock()
	for _, c := range claims {
		p := WebhookPayload{DeliveryID: c.ID, Claim: c.Claim.UnixMicro()}
		s.attempts.Go(func() {
			defer func() {
				s.mu.Lock()
				s.inflight--
				s.mu.Unlock()
				s.wake() // a slot is free: more may be due
			}()
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*webhooks.Timeout)
			defer cancel()
			if err := s.attempt(actx, p); err != nil {
				// Its claim runs out and it is due again.
				s.log.WarnContext(ctx, "webhook attempt failed to run; its delivery is due again once its claim runs out",
					"delivery_id", p.DeliveryID, "error", err)
				return
			}
			if s.processed != nil {
				s.processed.Inc()
			}
		})
	}
	return len(claims), nil
}

// wait waits, up to timeout, for the attempts under way; one that
// outlasts it is made again once its claim runs out.
func (s *webhookSender) wait(timeout time.Duration) {
	idle := make(chan struct{})
	go func() {
		s.attempts.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-time.After(timeout):
	}
}

// Event is the body of a webhook delivery.
type Event struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"created_at"`
	Data      any       `json:"data"`
}

// TestEventData is the data of a test event (models.EventTest): the
// endpoint it was sent to.
type TestEventData struct {
	EndpointID string `json:"endpoint_id"`
}

// attempt makes one attempt of a delivery and records its outcome. It
// returns nil whatever the endpoint answered (the outcome schedules the
// next attempt); an error only when it could not read or write the
// delivery, whose claim then runs out.
func (s *webhookSender) attempt(ctx context.Context, p WebhookPayload) (err error) {
	if s.tracer != nil {
		var span trace.Span
		ctx, span = s.tracer.Start(ctx, "webhook attempt", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("valruns.webhook.delivery_id", p.DeliveryID)))
		defer func() { endSpan(span)(err) }()
	}
	claim := time.UnixMicro(p.Claim)
	job, err := s.store.DeliveryJob(ctx, p.DeliveryID, claim)
	if errors.Is(err, models.ErrNotFound) {
		return nil // delivered, failed, its endpoint deleted, or claimed again meanwhile
	}
	if err != nil {
		return err
	}
	d := job.Delivery
	var data any = TestEventData{EndpointID: d.EndpointID}
	if job.Run != nil {
		data = s.eventData(job.Run)
	}
	body, err := json.Marshal(Event{ID: d.EventID, Type: d.EventType, CreatedAt: d.CreatedAt.UTC(), Data: data})
	if err != nil {
		return fmt.Errorf("webhook event %s: %w", d.EventID, err)
	}
	now := time.Now()
	res := s.send.Send(ctx, job.Endpoint.URL, d.EventID, job.Endpoint.SigningSecrets(now), body, now)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("valruns.webhook.event_id", d.EventID), attribute.String("valruns.webhook.endpoint_id", d.EndpointID),
			attribute.String("valruns.run_id", job.Run.ID), attribute.Int("valruns.webhook.attempt", d.Attempts+1),
			attribute.Int("http.response.status_code", res.StatusCode), attribute.Bool("valruns.webhook.delivered", res.Delivered))
	}
	a := models.Attempt{Delivered: res.Delivered, StatusCode: res.StatusCode, Retry: WebhookRetryDelay(s.base, d.Attempts+1)}
	if res.Err != nil {
		// Coarse: the tenant sees it. The detail (addresses, the resolver)
		// goes to the worker's log only.
		a.Error = webhooks.Reason(res.Err)
	} else if !res.Delivered {
		a.Error = webhooks.Answered(res.StatusCode)
	}
	wctx, cancel := detached(ctx)
	defer cancel()
	status, err := s.store.RecordAttempt(wctx, d.ID, claim, a, s.horizon)
	if err != nil {
		return err
	}
	outcome := map[string]string{models.DeliveryDelivered: "delivered", models.DeliveryPending: "retried", models.DeliveryFailed: "failed"}[status]
	if outcome != "" {
		s.m.attempts.WithLabelValues(outcome).Inc()
	}
	log := s.log.With("delivery_id", d.ID, "event_id", d.EventID, "endpoint_id", d.EndpointID, "attempt", d.Attempts+1)
	if res.Err != nil {
		log = log.With("detail", res.Err.Error())
	}
	switch status {
	case models.DeliveryDelivered:
		log.InfoContext(ctx, "webhook delivered", "status_code", res.StatusCode)
	case models.DeliveryPending:
		log.InfoContext(ctx, "webhook not delivered; retried later", "status_code", res.StatusCode, "error", a.Error, "retry_in", a.Retry)
	case models.DeliveryFailed:
		log.WarnContext(ctx, "webhook not delivered; given up", "status_code", res.StatusCode, "error", a.Error)
	default:
		log.InfoContext(ctx, "webhook attempt not recorded: its claim ran out and the delivery was claimed again, or is done",
			"status_code", res.StatusCode, "error", a.Error)
	}
	return nil
}
