package client_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/client"
	"github.com/valruns/valruns/internal/webhooktest"
	"github.com/valruns/valruns/webhooks"
)

// vectorHeader is the delivery of the Standard Webhooks specification's
// test vector, with signature as its webhook-signature.
func vectorHeader(signature string) http.Header {
	h := http.Header{}
	h.Set(client.HeaderWebhookID, webhooktest.ID)
	h.Set(client.HeaderWebhookTimestamp, strconv.Itoa(webhooktest.Timestamp))
	h.Set(client.HeaderWebhookSignature, signature)
	return h
}

// vectorWith is the vector's delivery with the header name set to value
// ("": without it).
func vectorWith(name, value string) http.Header {
	h := vectorHeader(webhooktest.Signature)
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
	sent := time.Unix(webhooktest.Timestamp, 0)
	body := []byte(webhooktest.Body)
	ok := vectorHeader(webhooktest.Signature)
	for _, now := range []time.Time{sent, sent.Add(5 * time.Minute), sent.Add(-5 * time.Minute), sent.Add(299 * time.Second)} {
		require.NoError(t, client.VerifyWebhookAt([]string{webhooktest.Secret}, ok, body, 5*time.Minute, now), "now %s", now)
	}
	require.NoError(t, client.VerifyWebhookAt([]string{webhooktest.Secret}, ok, body, 0, sent.Add(4*time.Minute)), "0: the default tolerance")
	require.NoError(t, client.VerifyWebhookAt([]string{webhooktest.Secret[len("whsec_"):]}, ok, body, 0, sent), "the secret without its prefix")

	// A header built by hand, its names in lower case, as on the wire.
	lower := http.Header{"webhook-id": {webhooktest.ID}, "webhook-timestamp": {strconv.Itoa(webhooktest.Timestamp)},
		"webhook-signature": {webhooktest.Signature}}
	require.NoError(t, client.VerifyWebhookAt([]string{webhooktest.Secret}, lower, body, 0, sent))

	// Among other signatures: another version's, a malformed one, one of another secret.
	several := vectorHeader("v1a,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,not-base64! v1,AAAA " + webhooktest.Signature)
	require.NoError(t, client.VerifyWebhookAt([]string{webhooktest.Secret}, several, body, 0, sent))

	for _, tt := range []struct {
		name   string
		secret string
		header http.Header
		body   string
		now    time.Time
		want   error
	}{
		{"body changed", webhooktest.Secret, ok, `{"test": 2432232315}`, sent, client.ErrWebhookSignature},
		{"body re-encoded", webhooktest.Secret, ok, `{"test":2432232314}`, sent, client.ErrWebhookSignature},
		{"another secret", webhooktest.OtherSecret, ok, webhooktest.Body, sent, client.ErrWebhookSignature},
		{"another id", webhooktest.Secret, vectorWith(client.HeaderWebhookID, "msg_other"), webhooktest.Body, sent, client.ErrWebhookSignature},
		{"another timestamp", webhooktest.Secret, vectorWith(client.HeaderWebhookTimestamp, strconv.Itoa(webhooktest.Timestamp+1)), webhooktest.Body, sent, client.ErrWebhookSignature},
		{"only another version's signature", webhooktest.Secret, vectorHeader("v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
			webhooktest.Body, sent, client.ErrWebhookSignature},
		{"too old", webhooktest.Secret, ok, webhooktest.Body, sent.Add(5*time.Minute + time.Second), client.ErrWebhookTimestamp},
		{"from the future", webhooktest.Secret, ok, webhooktest.Body, sent.Add(-5*time.Minute - time.Second), client.ErrWebhookTimestamp},
		{"years later", webhooktest.Secret, ok, webhooktest.Body, time.Now(), client.ErrWebhookTimestamp},
		{"timestamp not a number", webhooktest.Secret, vectorWith(client.HeaderWebhookTimestamp, "2021-02-25T15:02:10Z"), webhooktest.Body, sent, client.ErrWebhookTimestamp},
		{"timestamp far out", webhooktest.Secret, vectorWith(client.HeaderWebhookTimestamp, "-9223372036854775808"), webhooktest.Body, sent, client.ErrWebhookTimestamp},
		{"no id", webhooktest.Secret, vectorWith(client.HeaderWebhookID, ""), webhooktest.Body, sent, client.ErrWebhookHeaders},
		{"no timestamp", webhooktest.Secret, vectorWith(client.HeaderWebhookTimestamp, ""), webhooktest.Body, sent, client.ErrWebhookHeaders},
		{"no signature", webhooktest.Secret, vectorHeader(""), webhooktest.Body, sent, client.ErrWebhookHeaders},
		{"secret not base64", "whsec_not base64!", ok, webhooktest.Body, sent, client.ErrWebhookSecret},
		{"secret empty", "", ok, webhooktest.Body, sent, client.ErrWebhookSecret},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := client.VerifyWebhookAt([]string{tt.secret}, tt.header, []byte(tt.body), 5*time.Minute, tt.now)
			require.ErrorIs(t, err, tt.want)
		})
	}
}

// TestVerifyWebhookOfTheServersSignature: what the server signs (package
// webhooks) verifies, with either secret while two overlap after a
// rotation, and not with a third.
func TestVerifyWebhookOfTheServersSignature(t *testing.T) {
	t.Parallel()
	now := time.Now()
	body := []byte(`{"id":"evt_1","type":"validation_run.finished","data":{"status":"passed"}}`)
	third := "whsec_dGhpcmQtc2VjcmV0LW5ldmVyLXVzZWQ="
	sig, err := webhooks.Sign([]string{webhooktest.OtherSecret, webhooktest.Secret}, "evt_1", now.Unix(), body)
	require.NoError(t, err)
	h := http.Header{}
	h.Set(client.HeaderWebhookID, "evt_1")
	h.Set(client.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(client.HeaderWebhookSignature, sig)

	require.NoError(t, client.VerifyWebhookAt([]string{webhooktest.Secret}, h, body, 0, now))
	require.NoError(t, client.VerifyWebhookAt([]string{webhooktest.OtherSecret}, h, body, 0, now))
	require.ErrorIs(t, client.VerifyWebhookAt([]string{third}, h, body, 0, now), client.ErrWebhookSignature)
	require.NoError(t, client.VerifyWebhookAt([]string{third, webhooktest.OtherSecret}, h, body, 0, now), "any secret the receiver holds")
	require.ErrorIs(t, client.VerifyWebhookAt(nil, h, body, 0, now), client.ErrWebhookSecret)
	require.NoError(t, client.VerifyWebhook([]string{webhooktest.Secret}, h, body, 0), "against the clock, signed just now")
	require.ErrorIs(t, client.VerifyWebhookAt([]string{webhooktest.Secret}, h, append(body, ' '), 0, now), client.ErrWebhookSignature)
}
