package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valruns/valruns/webhooks"
)

// webhookOutage is how long webhook_outage's receiver is down: the issue's
// 60 s, longer than the first retries (WEBHOOK_RETRY_BASE 4s: 4, 16, 64 s).
const webhookOutage = 60 * time.Second

// hookSink is a webhook receiver on a fixed address that can go down
// (connections refused) and come back. It records every POST it answered
// and whether its signature held.
type hookSink struct {
	addr   string
	secret string
	mu     sync.Mutex
	srv    *http.Server
	ids    map[string]int // webhook-id -> POSTs answered 200
	bad    []string       // what was wrong with POSTs refused
	// hold, when set before the first POST, makes the sink hold that POST
	// unanswered until its connection closes (a receiver that hangs);
	// held is closed when it arrives, heldID is its webhook-id.
	hold   bool
	held   chan struct{}
	heldID string
}

func newHookSink(t *testing.T) *hookSink {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &hookSink{addr: l.Addr().String(), ids: map[string]int{}, held: make(chan struct{})}
	s.serve(l)
	t.Cleanup(s.down)
	return s
}

// subscribe registers the sink as a webhook endpoint of o, and keeps the
// endpoint's secret to check the signatures it receives.
func (s *hookSink) subscribe(t *testing.T, cl *client, o org) {
	t.Helper()
	out := cl.do(context.Background(), request{Method: "POST", Path: "/api/webhook-endpoints/", Key: "hook-1",
		Body: `{"url":"http://` + s.addr + `/hooks"}`, Token: o.Token}, 0)
	if !out.Definitive || out.Final.Status != 201 {
		t.Fatalf("create the webhook endpoint: %s", lastOf(out))
	}
	var ep struct {
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal(out.Final.Body, &ep); err != nil || ep.Secret == "" {
		t.Fatalf("create the webhook endpoint: %s", clip(out.Final.Body))
	}
	s.mu.Lock()
	s.secret = ep.Secret
	s.mu.Unlock()
}

func (s *hookSink) serve(l net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(s.handle), ReadHeaderTimeout: 5 * time.Second}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

// down closes the listener and every connection: attempts are refused.
func (s *hookSink) down() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// up listens on the same address again.
func (s *hookSink) up(t *testing.T) {
	t.Helper()
	var l net.Listener
	if !waitUntil(10*time.Second, func() bool {
		var err error
		l, err = net.Listen("tcp", s.addr)
		return err == nil
	}) {
		t.Fatalf("the receiver's address %s did not come free", s.addr)
	}
	s.serve(l)
}

func (s *hookSink) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	id := r.Header.Get("webhook-id")
	ts, terr := strconv.ParseInt(r.Header.Get("webhook-timestamp"), 10, 64)
	s.mu.Lock()
	if s.hold {
		s.hold = false
		s.heldID = id
		close(s.held)
		s.mu.Unlock()
		<-r.Context().Done() // its sender is gone
		return
	}
	defer s.mu.Unlock()
	want, serr := webhooks.Sign([]string{s.secret}, id, ts, body)
	var ev struct {
		ID string `json:"id"`
	}
	switch {
	case err != nil || terr != nil || serr != nil:
		s.bad = append(s.bad, "unreadable attempt of "+id)
	case r.Header.Get("webhook-signature") != want:
		s.bad = append(s.bad, "bad signature on "+id)
	case json.Unmarshal(body, &ev) != nil || ev.ID != id:
		s.bad = append(s.bad, "body of "+id+" is not its event")
	default:
		s.ids[id]++
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(http.StatusBadRequest)
}

func (s *hookSink) received() (map[string]int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make(map[string]int, len(s.ids))
	for k, v := range s.ids {
		ids[k] = v
	}
	return ids, append([]string(nil), s.bad...)
}

// webhookOutageScenario: an organisation with a webhook endpoint starts
// runs; during the load its receiver goes down for 60 s, and worker A is
// killed (kill -9) a few seconds into the outage, with events recorded and
// not yet delivered. Once the receiver is back, every run's event is
// delivered, each validly signed; a duplicate shows only as a webhook-id
// received again; no delivery ends failed.
func webhookOutageScenario(t *testing.T, s *suite, res *result) {
	c, cl, rec, o := setup(t, s, "hookoutage")
	sink := newHookSink(t)
	sink.subscribe(t, cl, o)

	def := orderWorkflow()
	wf := createWorkflow(t, cl, o, def)
	ops := makeOps("hook", 60, o, wf, def)
	l := startLoad(context.Background(), cl, ops, 3)
	if !waitUntil(30*time.Second, func() bool { return l.done.Load() >= 10 }) {
		t.Fatalf("the load did not get under way (%d of %d starts answered)", l.done.Load(), len(ops))
	}
	faultAt := time.Now()
	sink.down()
	time.Sleep(5 * time.Second)
	c.workers[0].kill()
	l.wait()
	time.Sleep(time.Until(faultAt.Add(webhookOutage)))
	pending, err := c.count(`SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'`)
	if err != nil {
		t.Fatalf("count pending deliveries: %v", err)
	}
	t.Logf("receiver down for %s; %d deliveries pending when it comes back", time.Since(faultAt).Round(time.Second), pending)
	if pending == 0 {
		res.fail(t, "no delivery was pending at the end of the outage: the scenario proved nothing")
	}
	sink.up(t)
	back := time.Now()

	verify(t, c, res, ops, expectations{faultAt: faultAt, finalBy: time.Now().Add(finalWithin)})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)

	want := map[string]bool{}
	for _, o := range ops {
		if o.RunID != "" {
			want["evt_"+strings.ReplaceAll(o.RunID, "-", "")] = true
		}
	}
	// The longest wait after the outage: an attempt just before the receiver
	// came back is retried after at most 64 s (the fourth delay), then
	// claimed within a poll.
	if !waitUntil(3*time.Minute, func() bool {
		n, err := c.count(`SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'`)
		return err == nil && n >= int64(len(want))
	}) {
		res.fail(t, "not every event was delivered within 3 min of the receiver's return")
	}
	t.Logf("every event delivered %s after the receiver came back", time.Since(back).Round(time.Second))
	if n, err := c.count(`SELECT count(*) FROM webhook_deliveries WHERE status = 'failed'`); err != nil || n != 0 {
		res.fail(t, "%d deliveries failed (%v)", n, err)
	}
	ids, bad := sink.received()
	for _, b := range bad {
		res.fail(t, "receiver: %s", b)
	}
	dups := 0
	for id, n := range ids {
		if !want[id] {
			res.fail(t, "receiver got event %s, which no run of the load has", id)
		}
		dups += n - 1
	}
	for id := range want {
		if ids[id] == 0 {
			res.fail(t, "event %s never reached the receiver", id)
		}
	}
	t.Logf("%d events, each received; %d received again (the same webhook-id)", len(want), dups)
}

// webhookClaimLease is webhook_attempt_kill's WEBHOOK_CLAIM_LEASE: a
// killed worker's claim runs out soon.
const webhookClaimLease = 3 * time.Second

// webhookAttemptKill: one worker; an organisation with a webhook endpoint
// whose receiver holds the first attempt it gets unanswered (it hangs).
// While the attempt is under way its worker gets kill -9 and a new worker
// starts at once. The delivery whose attempt died is attempted again, with
// the same webhook-id, and delivered: asynq archived the dead attempt's
// task, and the next claim of the delivery must not stand behind it.
// Every other run's event is delivered too, none failed.
func webhookAttemptKill(t *testing.T, s *suite, res *result) {
	c := newClusterWith(t, s, 2, 1, func(*cluster) []string {
		return []string{"WEBHOOK_CLAIM_LEASE=" + webhookClaimLease.String()}
	})
	rec := &recorder{}
	cl := newClient(c.baseURLs(), rec, s.cfg.MaxBodyBytes)
	t.Cleanup(cl.close)
	o := c.newOrg("hookkill")
	sink := newHookSink(t)
	sink.mu.Lock()
	sink.hold = true
	sink.mu.Unlock()
	sink.subscribe(t, cl, o)

	def := orderWorkflow()
	wf := createWorkflow(t, cl, o, def)
	ops := makeOps("hookkill", 6, o, wf, def)
	l := startLoad(context.Background(), cl, ops, 2)
	select {
	case <-sink.held:
	case <-time.After(60 * time.Second):
		t.Fatalf("no webhook attempt reached the receiver within 60 s (%d of %d starts answered)", l.done.Load(), len(ops))
	}
	sink.mu.Lock()
	heldID := sink.heldID
	sink.mu.Unlock()
	faultAt := time.Now()
	c.workers[0].kill()
	t.Logf("worker A killed while its attempt of %s was held by the receiver", heldID)
	next := c.startProc("worker-B", "worker", "WORKER_METRICS_ADDR")
	if next == nil {
		t.FailNow() // startProc reported why
	}
	c.workers = append(c.workers, next)
	l.wait()
	verify(t, c, res, ops, expectations{faultAt: faultAt, finalBy: time.Now().Add(finalWithin)})
	res.Requests = rec.requests.Load()
	res.judge5xx(t, rec, nil)

	want := map[string]bool{}
	for _, o := range ops {
		if o.RunID != "" {
			want["evt_"+strings.ReplaceAll(o.RunID, "-", "")] = true
		}
	}
	if !want[heldID] {
		res.fail(t, "the receiver held event %s, which no run of the load has", heldID)
	}
	// The claim runs out WEBHOOK_CLAIM_LEASE after it was made, and the
	// next poll claims it again: a minute is a generous bound.
	redone := waitUntil(60*time.Second, func() bool {
		ids, _ := sink.received()
		return ids[heldID] > 0
	})
	if !redone {
		res.fail(t, "the attempt of %s that died with worker A was not made again within 60 s (WEBHOOK_CLAIM_LEASE %s)", heldID, webhookClaimLease)
	} else {
		res.Figures = append(res.Figures, fmt.Sprintf("the event whose attempt died was received again %.1f s after the kill, the new worker's start included (WEBHOOK_CLAIM_LEASE %s)",
			time.Since(faultAt).Seconds(), webhookClaimLease))
	}
	if !waitUntil(60*time.Second, func() bool {
		n, err := c.count(`SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'`)
		return err == nil && n >= int64(len(want))
	}) {
		res.fail(t, "not every event was delivered within 60 s of the load's end")
	}
	if n, err := c.count(`SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered'`); err != nil || n != 0 {
		res.fail(t, "%d deliveries not delivered (%v)", n, err)
	}
	ids, bad := sink.received()
	for _, b := range bad {
		res.fail(t, "receiver: %s", b)
	}
	for id := range ids {
		if !want[id] {
			res.fail(t, "receiver got event %s, which no run of the load has", id)
		}
	}
	for id := range want {
		if ids[id] == 0 {
			res.fail(t, "event %s never reached the receiver", id)
		}
	}
	t.Logf("%d events, each received; the one held at the kill (%s) received %d time(s) after it", len(want), heldID, ids[heldID])
}
