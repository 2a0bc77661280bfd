package webhooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"syscall"
	"time"
)

// Limits of one delivery attempt (issue 19): a 2xx answer within Timeout is
// success; at most MaxAnswerBytes of the answer are read.
const (
	Timeout        = 10 * time.Second
	MaxAnswerBytes = 64 << 10
)

// Sender POSTs signed events to endpoints, one attempt per Send. It never
// follows a redirect (a 3xx is a failed attempt), never goes through a
// proxy from the environment, and, unless private targets are allowed,
// refuses to connect to an address PublicAddr rejects: the check runs on
// the address being dialled, after the name was resolved, so a public
// name that resolves to 127.0.0.1 is refused too.
type Sender struct {
	client *http.Client
}

// NewSender returns a Sender; allowPrivate is WEBHOOK_ALLOW_PRIVATE_TARGETS,
// timeout bounds an attempt (0 means Timeout).
func NewSender(allowPrivate bool, timeout time.Duration) *Sender {
	if timeout <= 0 {
		timeout = Timeout
	}
	dialer := &net.Dialer{Timeout: timeout}
	if !allowPrivate {
		dialer.Control = func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			a, err := netip.ParseAddr(host)
			if err != nil || !PublicAddr(a) {
				return fmt.Errorf("%w: %s", ErrPrivateTarget, host)
			}
			return nil
		}
	}
	transport := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       90 * time.Second,
	}
	return &Sender{client: &http.Client{
		Transport:     transport,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Result is the outcome of one attempt.
type Result struct {
	// Delivered: the endpoint answered 2xx.
	Delivered bool
	// StatusCode is the answer's status; 0 when there was none.
	StatusCode int
	// Err says why there was no answer (refused, timed out, a private
	// target), or is nil.
	Err error
}

// Send makes one attempt to deliver body to url with the Standard Webhooks
// headers: webhook-id (eventID, the same on every attempt),
// webhook-timestamp (now, unix seconds) and webhook-signature (Sign with
// secrets).
func (s *Sender) Send(ctx context.Context, url, eventID string, secrets []string, body []byte, now time.Time) Result {
	ts := now.Unix()
	sig, err := Sign(secrets, eventID, ts, body)
	if err != nil {
		return Result{Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Result{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "valruns-webhooks/1")
	req.Header.Set("webhook-id", eventID)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := s.client.Do(req)
	if err != nil {
		return Result{Err: err}
	}
	// Read a bounded part of the answer (so the connection may be reused
	// when the answer is short), never all of it.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, MaxAnswerBytes))
	_ = resp.Body.Close()
	return Result{Delivered: resp.StatusCode >= 200 && resp.StatusCode < 300, StatusCode: resp.StatusCode}
}

// IsPrivateTarget reports whether err is a refusal of a private target.
func IsPrivateTarget(err error) bool { return errors.Is(err, ErrPrivateTarget) }
