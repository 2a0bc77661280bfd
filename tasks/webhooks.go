package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/webhooks"
)

// TypeWebhookDeliver makes one attempt of one webhook delivery
// (WebhookPayload).
const TypeWebhookDeliver = "webhook:deliver"

// webhookQueue is the asynq queue of webhook attempts: a server of its own
// (WebhookConcurrency) serves it, so slow receivers never hold the slots
// that execute runs.
const webhookQueue = "webhooks"

// WebhookPayload is the payload of TypeWebhookDeliver.
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
// (models.WebhookStore.ClaimDueDeliveries) and enqueues one task per
// attempt; the task sends the event (webhooks.Sender) and records the
// outcome, which schedules the next attempt. PostgreSQL says what is left
// to deliver: a task lost with Redis, a worker killed mid-attempt, or an
// outcome that could not be written leaves a claim that runs out (lease),
// and the delivery is claimed and attempted again.
type webhookSender struct {
	store  *models.WebhookStore
	client *asynq.Client
	send   *webhooks.Sender
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
		if n == s.limit {
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

// dispatch claims the deliveries due and enqueues an attempt of each. The
// TaskID names the delivery and its claim, a new one each time it is
// claimed: an attempt whose task asynq archived (its worker was killed
// while it ran, or it failed: it has no retries) never stands in the way
// of the next claim's. An attempt still waiting in Redis when its delivery
// is claimed again finds its claim gone and sends nothing (ProcessTask).
func (s *webhookSender) dispatch(ctx context.Context) (int, error) {
	claims, err := s.store.ClaimDueDeliveries(ctx, s.limit, webhookPerEndpoint, s.lease)
	if err != nil {
		return 0, err
	}
	for _, c := range claims {
		claim := c.Claim.UnixMicro()
		b, _ := json.Marshal(WebhookPayload{DeliveryID: c.ID, Claim: claim}) // a string and a number: cannot fail
		_, err := s.client.EnqueueContext(ctx, asynq.NewTask(TypeWebhookDeliver, b), asynq.Queue(webhookQueue),
			asynq.TaskID("webhook:"+c.ID+":"+strconv.FormatInt(claim, 10)), asynq.MaxRetry(0), asynq.Timeout(2*webhooks.Timeout))
		if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) { // a conflict: this claim's attempt is enqueued already
			// Its claim runs out and it is due again.
			s.log.WarnContext(ctx, "could not enqueue a webhook attempt; it is retried once its claim runs out",
				"delivery_id", c.ID, "error", err)
		}
	}
	return len(claims), nil
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

// ProcessTask makes one attempt of a delivery and records its outcome. It
// returns nil whatever the endpoint answered (the outcome schedules the
// next attempt, not asynq); an error only when it could not read or write
// the delivery, whose claim then runs out.
func (s *webhookSender) ProcessTask(ctx context.Context, t *asynq.Task) (err error) {
	var p WebhookPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil || p.DeliveryID == "" {
		return fmt.Errorf("webhook task payload %q: %w", t.Payload(), asynq.SkipRetry)
	}
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
