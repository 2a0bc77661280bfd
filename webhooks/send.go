package webhooks

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
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
// proxy from the environment, and sends only to a URL of a form CheckURL
// takes (one stored before a rule was added is refused). Unless private
// targets are allowed, it refuses to connect to an address PublicAddr
// rejects: the check runs on the address being dialled, after net/http
// mapped the host as CheckURL does and the name was resolved, so a public
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
		dialer.Control = checkDial
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

// checkDial is the dialer's Control when private targets are not allowed:
// address is the resolved "ip:port" about to be connected to.
func checkDial(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("%w: %s is not an address", ErrPrivateTarget, host)
	}
	if why := refusal(a); why != "" {
		return fmt.Errorf("%w: %s is %s", ErrPrivateTarget, host, why)
	}
	return nil
}

// Result is the outcome of one attempt.
type Result struct {
	// Delivered: the endpoint answered 2xx.
	Delivered bool
	// StatusCode is the answer's status; 0 when there was none.
	StatusCode int
	// Err says why there was no answer (refused, timed out, a private
	// target), or is nil; in detail, for logs: Reason(Err) is what a
	// delivery records.
	Err error
}

// Send makes one attempt to deliver body to url with the Standard Webhooks
// headers: webhook-id (eventID, the same on every attempt),
// webhook-timestamp (now, unix seconds) and webhook-signature (Sign with
// secrets).
func (s *Sender) Send(ctx context.Context, url, eventID string, secrets []string, body []byte, now time.Time) Result {
	// The URL's form, as registration checks it; its address is checked
	// when dialled, after the name resolved.
	if err := CheckURL(url, true); err != nil {
		return Result{Err: fmt.Errorf("%w: %w", errBadURL, err)}
	}
	ts := now.Unix()
	sig, err := Sign(secrets, eventID, ts, body)
	if err != nil {
		return Result{Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Result{Err: fmt.Errorf("%w: %w", errBadURL, err)}
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

// Why an attempt got no answer, as a delivery records it and the API shows
// it (Reason). Coarse on purpose: a tenant must not learn from a delivery
// what a name resolves to inside the network, nor the resolver's address.
const (
	ReasonNotAllowed  = "the target's address is not allowed"
	ReasonUnresolved  = "the host name could not be resolved"
	ReasonRefused     = "connection refused"
	ReasonTimedOut    = "timed out"
	ReasonClosed      = "the connection was closed before an answer"
	ReasonUnreachable = "the target is unreachable"
	ReasonTLS         = "the TLS handshake failed"
	ReasonBadURL      = "the URL cannot be sent to"
	ReasonFailed      = "the connection failed"
)

// Reason is the coarse reason for err, an attempt's Result.Err: one of the
// Reason constants, never an address or a host name.
func Reason(err error) string {
	var dns *net.DNSError
	var ne net.Error
	var tlsAlert tls.AlertError
	var tlsRecord tls.RecordHeaderError
	var cert *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	var invalidCert x509.CertificateInvalidError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrPrivateTarget):
		return ReasonNotAllowed
	case errors.As(err, &dns):
		return ReasonUnresolved
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return ReasonTimedOut
	case errors.Is(err, syscall.ECONNREFUSED):
		return ReasonRefused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EADDRNOTAVAIL):
		return ReasonUnreachable
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ReasonClosed
	case errors.As(err, &tlsAlert), errors.As(err, &tlsRecord), errors.As(err, &cert), errors.As(err, &unknownCA),
		errors.As(err, &badHost), errors.As(err, &invalidCert):
		return ReasonTLS
	case errors.Is(err, errBadURL):
		return ReasonBadURL
	}
	return ReasonFailed
}

// Answered is what a delivery records of an attempt answered with a
// status other than 2xx.
func Answered(status int) string { return "answered " + strconv.Itoa(status) }

// Shown is what the API shows of a delivery's recorded last_error: the
// reason itself when it is one that Reason or Answered gives; anything else
// (recorded before reasons were coarse, an address in it) is ReasonFailed.
func Shown(recorded string) string {
	switch recorded {
	case ReasonNotAllowed, ReasonUnresolved, ReasonRefused, ReasonTimedOut, ReasonClosed, ReasonUnreachable,
		ReasonTLS, ReasonBadURL, ReasonFailed:
		return recorded
	}
	if n, ok := strings.CutPrefix(recorded, "answered "); ok {
		if code, err := strconv.Atoi(n); err == nil && code >= 100 && code <= 999 && Answered(code) == recorded {
			return recorded
		}
	}
	return ReasonFailed
}

// errBadURL: the endpoint's URL is one CheckURL refuses (stored before a
// rule was added), or could not make a request.
var errBadURL = errors.New("the URL cannot make a request")
