package webhooks_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/webhooktest"
	"github.com/valruns/valruns/webhooks"
)

// The Standard Webhooks specification's published test vector: matching it
// is what lets receivers verify deliveries with any of its libraries.
func TestSignStandardWebhooksVector(t *testing.T) {
	t.Parallel()
	sig, err := webhooks.Sign([]string{webhooktest.Secret}, webhooktest.ID, webhooktest.Timestamp, []byte(webhooktest.Body))
	require.NoError(t, err)
	require.Equal(t, webhooktest.Signature, sig)
}

func TestSignTwoSecretsDuringRotation(t *testing.T) {
	t.Parallel()
	sig, err := webhooks.Sign([]string{webhooktest.OtherSecret, webhooktest.Secret}, webhooktest.ID, webhooktest.Timestamp, []byte(webhooktest.Body))
	require.NoError(t, err)
	parts := strings.Split(sig, " ")
	require.Len(t, parts, 2)
	require.Equal(t, webhooktest.Signature, parts[1])
	require.NotEqual(t, parts[0], parts[1])
	require.True(t, strings.HasPrefix(parts[0], "v1,"))

	_, err = webhooks.Sign([]string{"whsec_not base64!"}, "id", 1, nil)
	require.Error(t, err)
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		url          string
		public, priv bool // accepted without / with WEBHOOK_ALLOW_PRIVATE_TARGETS
	}{
		{"https://example.com/hooks", true, true},
		{"http://example.com:8080/hooks?x=1", true, true},
		{"https://93.184.215.14/hooks", true, true},
		{"https://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/", true, true},
		{"http://127.0.0.1:8080/hooks", false, true},
		{"http://[::1]/", false, true},
		{"http://[::ffff:127.0.0.1]/", false, true},
		{"http://10.1.2.3/", false, true},
		{"http://172.16.0.1/", false, true},
		{"http://192.168.1.1/", false, true},
		{"http://169.254.169.254/latest/meta-data/", false, true},
		{"http://[fd00:ec2::254]/", false, true},
		{"http://100.64.0.1/", false, true},
		{"http://0.0.0.0/", false, true},
		{"http://localhost:8080/", false, true},
		{"http://api.localhost/", false, true},
		{"http://metadata.google.internal/", false, true},
		{"http://localhost.localdomain/", false, true},
		{"http://ip6-localhost/", false, true},
		{"http://ip6-loopback:8080/", false, true},
		// IPv6 ranges that reach an IPv4 address, and the 6to4 relay.
		{"http://[::127.0.0.1]:18998/h", false, true},
		{"http://[::7f00:1]:18998/h", false, true},
		{"http://[2002:7f00:1::]:18998/h", false, true},
		{"http://[2001:0:7f00:1::]/", false, true},
		{"http://[64:ff9b::7f00:1]/", false, true},
		{"http://[64:ff9b:1::a00:1]/", false, true},
		{"http://[::ffff:0:7f00:1]/", false, true},
		{"http://192.88.99.1/", false, true},
		// Never valid: IPv4 addresses not in dotted-decimal form, ports out of range.
		{"http://0x7f000001:18998/h", false, false},
		{"http://0X7F000001/", false, false},
		{"http://2130706433:18998/h", false, false},
		{"http://0177.0.0.1:18998/h", false, false},
		{"http://127.1:18998/h", false, false},
		{"http://0:18998/h", false, false},
		{"http://1.2.3.4.5/", false, false},
		{"http://example.com:0/", false, false},
		{"http://example.com:99999/", false, false},
		{"http://127.0.0.1:0/", false, false},
		{"http://./", false, false},
		{"http://example.com:/", true, true},
		{"http://x1.example/", true, true},
		{"http://0x.example.com/", true, true},
		{"ftp://example.com/", false, false},
		{"example.com/hooks", false, false},
		{"https:///path", false, false},
		{"https://user:pw@example.com/", false, false},
		{"https://example.com/#frag", false, false},
		{"", false, false},
		{"https://example.com/" + strings.Repeat("a", webhooks.MaxURLLength), false, false},
	} {
		require.Equal(t, tt.public, webhooks.CheckURL(tt.url, false) == nil, "%s without private targets", tt.url)
		require.Equal(t, tt.priv, webhooks.CheckURL(tt.url, true) == nil, "%s with private targets", tt.url)
	}
	require.False(t, webhooks.PublicAddr(netip.MustParseAddr("::ffff:10.0.0.1")))
	require.True(t, webhooks.PublicAddr(netip.MustParseAddr("8.8.8.8")))
	require.True(t, webhooks.PublicAddr(netip.MustParseAddr("2606:4700:4700::1111")))
	require.True(t, webhooks.PublicAddr(netip.MustParseAddr("2001:4860:4860::8888")), "outside Teredo's 2001::/32")
	for _, a := range []string{"::127.0.0.1", "::7f00:1", "::8.8.8.8", "2002:7f00:1::", "2002:808:808::1", "2001::1",
		"64:ff9b:1::1", "64:ff9b::8.8.8.8", "192.88.99.1"} {
		require.False(t, webhooks.PublicAddr(netip.MustParseAddr(a)), a)
	}
}
