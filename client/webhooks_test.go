package client_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/valruns/valruns/client"
)

// The Standard Webhooks specification's published test vector
// (https://github.com/standard-webhooks/standard-webhooks,
// spec/standard-webhooks.md): a delivery of vectorBody with webhook-id
// vectorID and webhook-timestamp vectorTimestamp, signed with vectorSecret,
// carries webhook-signature vectorSignature. The service's tests hold the same
// vector (internal/webhooktest) for its signing; this module imports nothing
// of the service's. vectorOtherSecret is a second secret, of a rotation.
const (
	vectorSecret      = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID          = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp   = 1614265330
	vectorBody        = `{"test": 2432232314}`
	vectorSignature   = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	vectorOtherSecret = "whsec_c2VjcmV0LW9mLWEtcm90YXRlZC1lbmRwb2ludA=="
)

// vectorHeader is the delivery of the Standard Webhooks specification's
// test vector, with signature as its webhook-signature.
func vectorHeader(signature string) http.Header {
	h := http.Header{}
	h.Set(client.HeaderWebhookID, vectorID)
	h.Set(client.HeaderWebhookTimestamp, strconv.Itoa(vectorTimestamp))
	h.Set(client.HeaderWebhookSignature, signature)
	return h
}

// vectorWith is the vector's delivery with the header name set to value
// ("": without it).
func vectorWith(name, value string) http.Header {
	h := vectorHeader(vectorSignature)
	h.Del(name)
	if value != "" {
		h.Set(name, value)
	}
	return h
}

// TestVerifyWebhookStandardVector: the specification's published vector
// verifies, at its time and within the tolerance either way, and nothing
// that differs from it does.
func TestVerifyWebhookStandardVector(t *testing.T) {
	t.Parallel()
	sent := time.Unix(vectorTimestamp, 0)
	body := []byte(vectorBody)
	ok := vectorHeader(vectorSignature)
	for _, now := range []time.Time{sent, sent.Add(5 * time.Minute), sent.Add(-5 * time.Minute), sent.Add(299 * time.Second)} {
		noError(t, client.VerifyWebhookAt([]string{vectorSecret}, ok, body, 5*time.Minute, now), "now %s", now)
	}
	noError(t, client.VerifyWebhookAt([]string{vectorSecret}, ok, body, 0, sent.Add(4*time.Minute)), "0: the default tolerance")
	noError(t, client.VerifyWebhookAt([]string{vectorSecret[len("whsec_"):]}, ok, body, 0, sent), "the secret without its prefix")

	// A header built by hand, its names in lower case, as on the wire.
	lower := http.Header{"webhook-id": {vectorID}, "webhook-timestamp": {strconv.Itoa(vectorTimestamp)},
		"webhook-signature": {vectorSignature}}
	noError(t, client.VerifyWebhookAt([]string{vectorSecret}, lower, body, 0, sent))

	// Among other signatures: another version's, a malformed one, one of another secret.
	several := vectorHeader("v1a,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,not-base64! v1,AAAA " + vectorSignature)
	noError(t, client.VerifyWebhookAt([]string{vectorSecret}, several, body, 0, sent))

	for _, tt := range []struct {
		name   string
		secret string
		header http.Header
		body   string
		now    time.Time
		want   error
	}{
		{"body changed", vectorSecret, ok, `{"test": 2432232315}`, sent, client.ErrWebhookSignature},
		{"body re-encoded", vectorSecret, ok, `{"test":2432232314}`, sent, client.ErrWebhookSignature},
		{"another secret", vectorOtherSecret, ok, vectorBody, sent, client.ErrWebhookSignature},
		{"another id", vectorSecret, vectorWith(client.HeaderWebhookID, "msg_other"), vectorBody, sent, client.ErrWebhookSignature},
		{"another timestamp", vectorSecret, vectorWith(client.HeaderWebhookTimestamp, strconv.Itoa(vectorTimestamp+1)), vectorBody, sent, client.ErrWebhookSignature},
		{"only another version's signature", vectorSecret, vectorHeader("v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
			vectorBody, sent, client.ErrWebhookSignature},
		{"too old", vectorSecret, ok, vectorBody, sent.Add(5*time.Minute + time.Second), client.ErrWebhookTimestamp},
		{"from the future", vectorSecret, ok, vectorBody, sent.Add(-5*time.Minute - time.Second), client.ErrWebhookTimestamp},
		{"years later", vectorSecret, ok, vectorBody, time.Now(), client.ErrWebhookTimestamp},
		{"timestamp not a number", vectorSecret, vectorWith(client.HeaderWebhookTimestamp, "2021-02-25T15:02:10Z"), vectorBody, sent, client.ErrWebhookTimestamp},
		{"timestamp far out", vectorSecret, vectorWith(client.HeaderWebhookTimestamp, "-9223372036854775808"), vectorBody, sent, client.ErrWebhookTimestamp},
		{"no id", vectorSecret, vectorWith(client.HeaderWebhookID, ""), vectorBody, sent, client.ErrWebhookHeaders},
		{"no timestamp", vectorSecret, vectorWith(client.HeaderWebhookTimestamp, ""), vectorBody, sent, client.ErrWebhookHeaders},
		{"no signature", vectorSecret, vectorHeader(""), vectorBody, sent, client.ErrWebhookHeaders},
		{"secret not base64", "whsec_not base64!", ok, vectorBody, sent, client.ErrWebhookSecret},
		{"secret empty", "", ok, vectorBody, sent, client.ErrWebhookSecret},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := client.VerifyWebhookAt([]string{tt.secret}, tt.header, []byte(tt.body), 5*time.Minute, tt.now)
			errorIs(t, err, tt.want)
		})
	}
}
