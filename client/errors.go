package client

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Sentinels to test an *Error against with errors.Is.
var (
	// ErrKeyReused: 422 idempotency_key_reused. The key was used for another
	// request (another body or another workflow); never retried. Fix the
	// caller, or use a new key.
	ErrKeyReused = errors.New("valruns: idempotency key reused with a different request")
	// ErrKeyInProgress: 409 idempotency_key_in_progress, the request with
	// this key is still being processed. Retried; seen only once the
	// attempts are spent.
	ErrKeyInProgress = errors.New("valruns: idempotency key in progress")
	// ErrQuotaExceeded: 429 quota_exceeded. The organisation has used its
	// monthly run quota; a stored, final answer, never retried.
	ErrQuotaExceeded = errors.New("valruns: monthly run quota exceeded")
	// ErrRateLimited: 429 rate_limited. The organisation started runs faster
	// than its rate; nothing was stored against the key. Retried after
	// Retry-After; seen only once the attempts are spent.
	ErrRateLimited = errors.New("valruns: start rate limited")
	// ErrTestEventsPending: 429 test_events_pending. The endpoint has as
	// many test events waiting for their attempt as it may (5); a stored,
	// final answer, never retried: send one later, with a new key.
	ErrTestEventsPending = errors.New("valruns: test events pending")
	// ErrNotFound: 404, no such workflow, run, webhook endpoint or delivery
	// in the organisation.
	ErrNotFound = errors.New("valruns: not found")
	// ErrUnauthorized: 401, no usable API token.
	ErrUnauthorized = errors.New("valruns: unauthorized")
	// ErrForbidden: 403.
	ErrForbidden = errors.New("valruns: forbidden")
)

// Problem codes the client acts on.
const (
	CodeKeyReused     = "idempotency_key_reused"
	CodeKeyInProgress = "idempotency_key_in_progress"
	CodeQuotaExceeded = "quota_exceeded"
	CodeRateLimited   = "rate_limited"
	// CodeTestEventsPending: SendWebhookTest past the endpoint's test
	// events waiting for their attempt.
	CodeTestEventsPending = "test_events_pending"
	CodeOverloaded        = "overloaded"
)

// FieldError names one invalid field of a request (a problem's errors).
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error is an answer of the API that is not a success: the RFC 9457
// problem document the server sent, or what could be made of a non-problem
// answer (a proxy's 502 page). Match it with errors.Is against the
// sentinels (ErrNotFound, ErrKeyReused...) or switch on Code.
type Error struct {
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Code is the stable machine-readable code ("" when the answer was not
	// a problem document).
	Code string `json:"code"`
	// Type is a URI reference naming the kind of problem: /problems/ and
	// the code, the path of the code's page on the service that answered.
	Type string `json:"type"`
	// Title is a short summary of the kind of problem.
	Title string `json:"title"`
	// Detail explains this occurrence.
	Detail string `json:"detail"`
	// Instance is the request path.
	Instance string `json:"instance,omitempty"`
	// RequestID is the X-Request-Id of the request, for support.
	RequestID string `json:"request_id,omitempty"`
	// Errors lists per-field problems of a 400.
	Errors []FieldError `json:"errors,omitempty"`
	// Replayed is true when the answer was the stored answer of an earlier
	// request with the same Idempotency-Key (Idempotent-Replayed: true).
	Replayed bool `json:"-"`
}

// Error is one line: the status, the code and the detail.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d", e.Status)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	} else if t := http.StatusText(e.Status); t != "" {
		b.WriteString(" " + t)
	}
	if e.Detail != "" {
		b.WriteString(": " + strings.Join(strings.Fields(e.Detail), " ")) // one line
	}
	if e.RequestID != "" {
		b.WriteString(" (request " + e.RequestID + ")")
	}
	return b.String()
}

// Is matches the sentinels: by problem code for the idempotency and quota
// answers, by status for 401, 403 and 404.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrKeyReused:
		return e.Code == CodeKeyReused
	case ErrKeyInProgress:
		return e.Code == CodeKeyInProgress
	case ErrQuotaExceeded:
		return e.Code == CodeQuotaExceeded
	case ErrRateLimited:
		return e.Code == CodeRateLimited
	case ErrTestEventsPending:
		return e.Code == CodeTestEventsPending
	case ErrNotFound:
		return e.Status == http.StatusNotFound
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized
	case ErrForbidden:
		return e.Status == http.StatusForbidden
	}
	return false
}

// RetryError is returned when a call stopped retrying: its attempts were
// spent, or its context ended while it was backing off or waiting for an
// answer. It wraps the last attempt's error (an *Error or a network error)
// and the context's error, so errors.Is(err, ErrKeyInProgress) or
// errors.Is(err, context.DeadlineExceeded) see through it.
type RetryError struct {
	// Attempts is how many requests were tried.
	Attempts int
	// Last is the error of the last attempt.
	Last error
	// Ctx is the context's error when the context ended the call, else nil.
	Ctx error
	// NotSent is true when no attempt left the client: each one failed to
	// connect (connection refused, no route, no such host). The server saw
	// nothing, so nothing was started. When false, an attempt may have
	// been processed: retry with the same key to find out.
	NotSent bool
}

func (e *RetryError) Error() string {
	if e.Ctx != nil {
		if e.Last == nil {
			return fmt.Sprintf("valruns: %v after %d attempts", e.Ctx, e.Attempts)
		}
		return fmt.Sprintf("valruns: %v after %d attempts; last error: %v", e.Ctx, e.Attempts, e.Last)
	}
	return fmt.Sprintf("valruns: gave up after %d attempts: %v", e.Attempts, e.Last)
}

// Unwrap returns the last attempt's error and the context's error.
func (e *RetryError) Unwrap() []error {
	var errs []error
	if e.Last != nil {
		errs = append(errs, e.Last)
	}
	if e.Ctx != nil {
		errs = append(errs, e.Ctx)
	}
	return errs
}
