package clienttest

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
