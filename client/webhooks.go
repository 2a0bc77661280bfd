package client

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names of a webhook delivery (Standard Webhooks).
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
)

// DefaultWebhookTolerance is how far a delivery's webhook-timestamp may be
// from now, either way, when VerifyWebhook is given no tolerance: the
// Standard Webhooks specification's five minutes.
const DefaultWebhookTolerance = 5 * time.Minute

// Errors of VerifyWebhook; each is wrapped with what was wrong. Answer a
// delivery that fails verification with a 4xx, and do not act on it.
var (
	// ErrWebhookHeaders: webhook-id, webhook-timestamp or
	// webhook-signature is missing or empty.
	ErrWebhookHeaders = errors.New("valruns: webhook: missing header")
	// ErrWebhookTimestamp: webhook-timestamp is not a Unix time in seconds,
	// or is further from now than the tolerance (a replayed or delayed
	// delivery).
	ErrWebhookTimestamp = errors.New("valruns: webhook: timestamp not accepted")
	// ErrWebhookSignature: no v1 signature of webhook-signature is the
	// secret's over this id, timestamp and body (another secret, or a body
	// changed on the way).
	ErrWebhookSignature = errors.New("valruns: webhook: no matching signature")
	// ErrWebhookSecret: the secret is not "whsec_" + base64, as the API
	// returned it when the endpoint was created or its secret rotated.
	ErrWebhookSecret = errors.New("valruns: webhook: invalid secret")
)

// VerifyWebhook checks that a webhook delivery comes from valruns, as the
// Standard Webhooks specification says (https://www.standardwebhooks.com/):
// webhook-signature holds, space-separated, one or more "v1," + base64 of
// HMAC-SHA256 over "webhook-id.webhook-timestamp.body" (two while a rotated
// secret overlaps the new one); one of them must be secret's, compared in
// constant time. webhook-timestamp (Unix seconds) must be within tolerance
// of now, either way (tolerance <= 0: DefaultWebhookTolerance). body is the
// request's body exactly as received, before any JSON decoding. secrets
// are the endpoint's "whsec_..." secrets you accept: one, or, while you
// switch to a rotated secret, the new one and the old one (a signature by
// any of them is enough).
//
// It returns nil for a genuine delivery, or an error that wraps
// ErrWebhookHeaders, ErrWebhookTimestamp, ErrWebhookSignature or
// ErrWebhookSecret. Deliveries come at least once: deduplicate on
// webhook-id, which is the same on every attempt of an event.
func VerifyWebhook(secrets []string, header http.Header, body []byte, tolerance time.Duration) error {
	return VerifyWebhookAt(secrets, header, body, tolerance, time.Now())
}

// VerifyWebhookAt is VerifyWebhook with now given (tests, a delivery kept
// and checked later).
func VerifyWebhookAt(secrets []string, header http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	if len(secrets) == 0 {
		return fmt.Errorf("%w: no secret given", ErrWebhookSecret)
	}
	keys := make([][]byte, len(secrets))
	for i, secret := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		if err != nil || len(key) == 0 {
			return fmt.Errorf("%w: want whsec_ followed by base64", ErrWebhookSecret)
		}
		keys[i] = key
	}
	id, ts, sigs := headerOf(header, HeaderWebhookID), headerOf(header, HeaderWebhookTimestamp), headerOf(header, HeaderWebhookSignature)
	for _, h := range []struct{ name, value string }{
		{HeaderWebhookID, id}, {HeaderWebhookTimestamp, ts}, {HeaderWebhookSignature, sigs},
	} {
		if h.value == "" {
			return fmt.Errorf("%w: %s", ErrWebhookHeaders, h.name)
		}
	}
	sent, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s %q is not a Unix time in seconds", ErrWebhookTimestamp, HeaderWebhookTimestamp, ts)
	}
	if tolerance <= 0 {
		tolerance = DefaultWebhookTolerance
	}
	// Compared in seconds, against bounds near now: a timestamp far in the
	// past or future would overflow a time.Duration or a difference.
	if tol := int64(tolerance / time.Second); sent < now.Unix()-tol || sent > now.Unix()+tol {
		return fmt.Errorf("%w: sent at %s, now is %s (tolerance %s)", ErrWebhookTimestamp,
			time.Unix(sent, 0).UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), tolerance)
	}
	for _, key := range keys {
		m := hmac.New(sha256.New, key)
		m.Write([]byte(id + "." + ts + "."))
		m.Write(body)
		want := m.Sum(nil)
		for _, sig := range strings.Fields(sigs) {
			version, value, ok := strings.Cut(sig, ",")
			if !ok || version != "v1" {
				continue // another scheme's signature: not ours to check
			}
			got, err := base64.StdEncoding.DecodeString(value)
			if err == nil && hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w for webhook-id %q", ErrWebhookSignature, id)
}

// headerOf is header's value of name, whatever the case of the map's key
// (a header built by hand may hold "webhook-id" as is).
func headerOf(header http.Header, name string) string {
	if v := header.Get(name); v != "" {
		return v
	}
	for k, vs := range header {
		if strings.EqualFold(k, name) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}
