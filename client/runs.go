package client

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// writeOptions are the options of every idempotent call.
type writeOptions struct {
	key  string
	wait time.Duration
}

// StartOption configures one StartRun call.
type StartOption interface{ applyStart(*startOptions) }

// CreateOption configures one CreateWorkflow call.
type CreateOption interface{ applyCreate(*writeOptions) }

// WriteOption configures any idempotent call: StartRun or CreateWorkflow.
type WriteOption func(*writeOptions)

func (o WriteOption) applyStart(s *startOptions)  { o(&s.writeOptions) }
func (o WriteOption) applyCreate(w *writeOptions) { o(w) }

// WithKey sets the call's Idempotency-Key. Without it (or with ""), the
// call generates one key with NewKey and sends it on every one of its
// retries. Pass your own to make an operation idempotent across calls and
// processes: the same key and the same request replay the first answer.
func WithKey(key string) WriteOption { return func(o *writeOptions) { o.key = key } }

// WithWait sends `Prefer: wait=N` (RFC 7240; N is d in whole seconds,
// rounded up): a server that finds the key in flight may wait up to N
// seconds for the first request to finish and answer its replay instead of
// a 409. d <= 0 sends nothing.
func WithWait(d time.Duration) WriteOption { return func(o *writeOptions) { o.wait = d } }

// preferWait is the Prefer header value for d, or "" for none.
func preferWait(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return "wait=" + strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

type startOptions struct {
	writeOptions
	metadata    json.RawMessage
	metadataErr error
}

type startOptionFunc func(*startOptions)

func (f startOptionFunc) applyStart(o *startOptions) { f(o) }

// WithMetadata sets the run's metadata: a value that encodes as a JSON
// object (a map, a struct, or a json.RawMessage), visible to the workflow's
// CEL assertions as `metadata`.
func WithMetadata(m any) StartOption {
	return startOptionFunc(func(o *startOptions) {
		o.metadata, o.metadataErr = json.Marshal(m)
	})
}

// StartResult is the answer to StartRun.
type StartResult struct {
	// Run is the run the call's key started (queued, or further along on a
	// replay).
	Run Run
	// Replayed is true when the answer was the stored answer of an earlier
	// request with the same key (Idempotent-Replayed: true): the run was
	// started before, possibly by an attempt whose answer was lost.
	Replayed bool
	// Key is the Idempotency-Key the call sent on every attempt.
	Key string
	// RequestID is the X-Request-Id of the answer.
	RequestID string
	// OriginalRequestID is, on a replay, the X-Request-Id of the request that
	// started the run.
	OriginalRequestID string
	// Attempts is how many requests the call sent.
	Attempts int
}

// StartRun starts a validation run of the workflow over submission (any
// value that encodes as JSON; pass a json.RawMessage to send bytes as they
// are). It is idempotent: one key per call (see WithKey), retried with the
// identical body on network errors, 409 in progress, 5xx and 429 other than
// quota_exceeded. Any other answer is an *Error (errors.Is ErrKeyReused,
// ErrQuotaExceeded, ErrNotFound, ErrUnauthorized...); spent attempts are a
// *RetryError wrapping the last cause.
func (c *Client) StartRun(ctx context.Context, workflowID string, submission any, opts ...StartOption) (*StartResult, error) {
	var o startOptions
	for _, opt := range opts {
		opt.applyStart(&o)
	}
	if workflowID == "" {
		return nil, errors.New("valruns: StartRun: empty workflow id")
	}
	if o.metadataErr != nil {
		return nil, fmt.Errorf("valruns: encode metadata: %w", o.metadataErr)
	}
	sub, err := json.Marshal(submission)
	if err != nil {
		return nil, fmt.Errorf("valruns: encode submission: %w", err)
	}
	body, err := json.Marshal(struct {
		Submission json.RawMessage `json:"submission"`
		Metadata   json.RawMessage `json:"metadata,omitempty"`
	}{sub, o.metadata})
	if err != nil {
		return nil, fmt.Errorf("valruns: encode the start request: %w", err)
	}
	var res StartResult
	resp, err := c.write(ctx, "/api/workflows/"+url.PathEscape(workflowID)+"/start/", body, o.writeOptions, &res.Run)
	if err != nil {
		return nil, err
	}
	res.Run.Raw = resp.body
	res.Replayed, res.Key, res.RequestID, res.OriginalRequestID, res.Attempts = resp.replayed, resp.key, resp.requestID, resp.originalRequestID, resp.attempts
	return &res, nil
}

// written is what an idempotent call learnt besides its answer's body.
type written struct {
	replayed          bool
	key               string
	requestID         string
	originalRequestID string
	attempts          int
	body              []byte // the answer's
}

// write POSTs body to path under one key for all attempts and decodes the
// 2xx answer into v.
func (c *Client) write(ctx context.Context, path string, body []byte, o writeOptions, v any) (written, error) {
	w := written{key: cmp.Or(o.key, NewKey())}
	for i := 0; i < len(w.key); i++ {
		if c := w.key[i]; c < 0x20 || c > 0x7e {
			return w, fmt.Errorf("valruns: the idempotency key must be printable ASCII; byte %d is %#x", i, c)
		}
	}
	hdr := http.Header{HeaderKey: {w.key}}
	if p := preferWait(o.wait); p != "" {
		hdr.Set(HeaderPrefer, p)
	}
	resp, attempts, err := c.do(ctx, http.MethodPost, path, body, hdr)
	if err != nil {
		return w, err
	}
	if err := json.Unmarshal(resp.body, v); err != nil {
		return w, fmt.Errorf("valruns: decode the answer to POST %s: %w", path, err)
	}
	w.replayed = resp.header.Get(HeaderReplayed) == "true"
	w.requestID = resp.header.Get(HeaderRequestID)
	w.originalRequestID = resp.header.Get(HeaderOriginalRequestID)
	w.attempts = attempts
	w.body = resp.body
	return w, nil
}

// GetRun reads a run with its findings.
func (c *Client) GetRun(ctx context.Context, runID string) (*Run, error) {
	r, _, err := c.readRun(ctx, runID, 0)
	return r, err
}

// readRun reads a run, asking the server to hold the request up to wait
// (whole seconds, `Prefer: wait=N`) while the run is not final; waited
// reports that the server did (Preference-Applied).
func (c *Client) readRun(ctx context.Context, runID string, wait time.Duration) (r *Run, waited bool, err error) {
	if runID == "" {
		return nil, false, errors.New("valruns: GetRun: empty run id")
	}
	var hdr http.Header
	if p := preferWait(wait); p != "" {
		hdr = http.Header{HeaderPrefer: {p}}
	}
	r = new(Run)
	resp, err := c.getWith(ctx, "/api/runs/"+url.PathEscape(runID)+"/", hdr, r)
	if err != nil {
		return nil, false, err
	}
	r.Raw = resp.body
	return r, resp.header.Get(HeaderPreferenceApplied) != "", nil
}

// DefaultLongPoll is the longest each request of WaitRun asks the server to
// hold it while the run is not final (`Prefer: wait=30`).
const DefaultLongPoll = 30 * time.Second

// WaitOption configures WaitRun.
type WaitOption func(*waitOptions)

type waitOptions struct {
	progress func(Run)
	min, max time.Duration
	longPoll time.Duration
}

// WithProgress calls f with the run after every answer (f runs on WaitRun's
// goroutine; keep it short). A request the server holds answers when the
// run is final or its wait ends: a status in between (running) shows only
// when a wait ends in it.
func WithProgress(f func(Run)) WaitOption { return func(o *waitOptions) { o.progress = f } }

// WithPollInterval sets the bounds of WaitRun's polling: the first wait is
// about min, doubling up to max. A value <= 0 keeps its default (200 ms, 2 s).
// A max set here also bounds how long the server may hold each request, so
// that a change of status is seen about that often: its whole seconds (a
// max under a second asks for no wait: plain polling). Without it, a
// request is held up to DefaultLongPoll.
func WithPollInterval(min, max time.Duration) WaitOption {
	return func(o *waitOptions) {
		if min > 0 {
			o.min = min
		}
		if max > 0 {
			o.max = max
			o.longPoll = max
		}
	}
}

// WaitRun waits until the run is final (passed, failed or error) and
// returns it. Each request is a GetRun, retried like any read, that asks the
// server to hold it until the run is final (`Prefer: wait=N`, N at most
// DefaultLongPoll, the http.Client's Timeout halved, and what is left of
// ctx), so a run that ends meanwhile costs one request. Against a server
// that answers at once (an older one, or one whose waiting is off or full),
// it polls, backing off between WithPollInterval's bounds. A request that
// still fails, or the end of ctx, ends the wait with that error (the run
// itself goes on).
func (c *Client) WaitRun(ctx context.Context, runID string, opts ...WaitOption) (*Run, error) {
	o := waitOptions{min: 200 * time.Millisecond, max: 2 * time.Second, longPoll: DefaultLongPoll}
	for _, opt := range opts {
		opt(&o)
	}
	o.max = max(o.max, o.min)
	delay := o.min
	for {
		r, waited, err := c.readRun(ctx, runID, c.longPoll(ctx, o.longPoll))
		if err != nil {
			return nil, err
		}
		if o.progress != nil {
			o.progress(*r)
		}
		if r.Final() {
			return r, nil
		}
		if waited {
			// The server held the request for its whole wait: ask again
			// soon, after a short pause (never a tight loop), without
			// backing off.
			delay = o.min
		}
		// Equal jitter: between half the delay and the delay, so polls of
		// many waiters spread out but never come back at once.
		t := time.NewTimer(delay/2 + rand.N(delay/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("valruns: waiting for run %s (last status %s): %w", runID, r.Status, ctx.Err())
		case <-t.C:
		}
		if !waited {
			delay = min(delay*2, o.max)
		}
	}
}

// longPoll is how long the next request of WaitRun may ask the server to
// hold it: at most limit, half the http.Client's Timeout (so an attempt does
// not time out while the server holds it), and the whole seconds left
// before ctx's deadline; 0 (ask for no wait) when that is under a second.
func (c *Client) longPoll(ctx context.Context, limit time.Duration) time.Duration {
	d := limit
	if c.hc.Timeout > 0 {
		d = min(d, c.hc.Timeout/2)
	}
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	if d < time.Second {
		return 0
	}
	return d.Truncate(time.Second)
}

// ListOption configures a list iterator.
type ListOption func(*listOptions)

type listOptions struct {
	pageSize int
	// runs are ListRuns' filters, as query parameters.
	runs url.Values
}

// WithPageSize sets how many items each page request asks for (the API
// allows 1 to 100; 0 means its default, 20).
func WithPageSize(n int) ListOption { return func(o *listOptions) { o.pageSize = n } }

// runFilter sets one of ListRuns' query parameters ("" removes it).
func runFilter(name, value string) ListOption {
	return func(o *listOptions) {
		if o.runs == nil {
			o.runs = url.Values{}
		}
		if value == "" {
			o.runs.Del(name)
			return
		}
		o.runs.Set(name, value)
	}
}

// WithStatus makes ListRuns list only the runs in that status:
// StatusQueued, StatusRunning, StatusPassed, StatusFailed or StatusError
// ("" for any). Other lists ignore it.
func WithStatus(status string) ListOption { return runFilter("status", status) }

// WithCreatedAfter makes ListRuns list only the runs created after t,
// exclusive (the zero time: no bound). Other lists ignore it.
func WithCreatedAfter(t time.Time) ListOption { return runFilter("created_after", rfc3339(t)) }

// WithCreatedBefore makes ListRuns list only the runs created before t,
// exclusive (the zero time: no bound). Other lists ignore it.
func WithCreatedBefore(t time.Time) ListOption { return runFilter("created_before", rfc3339(t)) }

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// ListRuns iterates over the organisation's runs, newest first, optionally
// of one workflow (workflowID "" means all), fetching pages as the loop
// goes; WithStatus, WithCreatedAfter and WithCreatedBefore narrow it. Runs
// in lists are summaries: their Submission, Metadata and Findings are nil
// (GetRun has them), so a page's size never depends on what runs hold. An
// error ends the iteration
// with (zero Run, err): a filter the server refuses is an *Error 400 whose
// Errors name it.
func (c *Client) ListRuns(ctx context.Context, workflowID string, opts ...ListOption) iter.Seq2[Run, error] {
	var o listOptions
	for _, opt := range opts {
		opt(&o)
	}
	q := url.Values{}
	for k, v := range o.runs {
		q[k] = v
	}
	if workflowID != "" {
		q.Set("workflow_id", workflowID)
	}
	return list[Run](ctx, c, "/api/runs/", q, opts)
}

// list iterates over the items of a paginated listing, following
// next_cursor until a page has none.
func list[T any](ctx context.Context, c *Client, path string, q url.Values, opts []ListOption) iter.Seq2[T, error] {
	var o listOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.pageSize != 0 {
		q.Set("limit", strconv.Itoa(o.pageSize))
	}
	return func(yield func(T, error) bool) {
		var zero T
		cursor := ""
		for {
			pq := url.Values{}
			for k, v := range q {
				pq[k] = v
			}
			if cursor != "" {
				pq.Set("cursor", cursor)
			}
			p := path
			if len(pq) > 0 {
				p += "?" + pq.Encode()
			}
			var pg page[T]
			if _, err := c.get(ctx, p, &pg); err != nil {
				yield(zero, err)
				return
			}
			for _, v := range pg.Data {
				if !yield(v, nil) {
					return
				}
			}
			switch pg.NextCursor {
			case "":
				return
			case cursor:
				yield(zero, fmt.Errorf("valruns: GET %s returned the cursor it was given: stopping", path))
				return
			}
			cursor = pg.NextCursor
		}
	}
}
