package webhooks_test

import (
	"net"
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
		{"http://0x7f.1:18998/h", false, false},
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

// Every spelling of a refused target is refused when an endpoint is
// registered, as net/http would dial it: a host that is not ASCII is
// mapped by UTS 46 first (full-width digits, ideographic full stops), so
// "１２７.０.０.１" is 127.0.0.1. The reserved ranges outside the net/netip
// predicates (documentation, benchmarking, discard-only, site-local) are
// refused, and so is a name a resolver would not take (two final dots).
// Public hosts, in any spelling, are still taken.
func TestCheckURLRefusesEverySpelling(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		url  string
		priv bool // accepted with WEBHOOK_ALLOW_PRIVATE_TARGETS: a private target, not a malformed one
		why  string
	}{
		// 127.0.0.1 written as net/http maps it.
		{"http://１２７.０.０.１/", true, "127.0.0.1 (written １２７.０.０.１) is a loopback address"},
		{"http://127。0。0。1:18998/h", true, "127.0.0.1 (written 127。0。0。1) is a loopback address"},
		{"http://１２７．０．０．１/", true, "loopback"},
		{"http://127｡0｡0｡1/", true, "loopback"},
		{"http://%EF%BC%91%EF%BC%92%EF%BC%97.0.0.1/", true, "loopback"},
		{"http://①②⑦.0.0.1/", true, "loopback"},
		{"http://127.0.0.1。/", true, "loopback"},
		{"http://１０.０.０.１/", true, "a private address"},
		{"http://１６９.２５４.１６９.２５４/", true, "link-local"},
		{"http://ｌｏｃａｌｈｏｓｔ:18998/h", true, "names a local or metadata host"},
		{"http://ＬＯＣＡＬＨＯＳＴ。/", true, "names a local or metadata host"},
		{"http://api.ｌｏｃａｌｈｏｓｔ/", true, "names a local or metadata host"},
		// Numeric IPv4 forms, also in full width: never valid.
		{"http://２１３０７０６４３３/", false, "four decimal numbers"},
		{"http://０x7f000001/", false, "four decimal numbers"},
		{"http://０１７７.０.０.１/", false, "four decimal numbers"},
		{"http://１２７.１/", false, "four decimal numbers"},
		// Documentation ranges, IPv4-mapped too.
		{"http://192.0.2.1/", true, "a documentation address (192.0.2.0/24)"},
		{"http://198.51.100.7:8080/h", true, "a documentation address (198.51.100.0/24)"},
		{"http://203.0.113.255/", true, "a documentation address (203.0.113.0/24)"},
		{"http://[2001:db8::1]/", true, "a documentation address (2001:db8::/32)"},
		{"http://[2001:db8:ffff::1]/", true, "documentation"},
		{"http://[3fff::1]/", true, "documentation"},
		{"http://[::ffff:192.0.2.1]/", true, "documentation"},
		{"http://[::ffff:c633:6401]/", true, "documentation"},
		{"http://１９２.０.２.１/", true, "documentation"},
		// Benchmarking, discard-only, site-local.
		{"http://[2001:2::1]/", true, "a benchmarking address (2001:2::/48)"},
		{"http://[2001:2:0:ffff::1]/", true, "benchmarking"},
		{"http://[100::1]/", true, "a discard-only address (100::/64)"},
		{"http://[fec0::1]/", true, "a site-local address (deprecated) (fec0::/10)"},
		{"http://[feff:ffff::1]/", true, "site-local"},
		// Names a resolver does not take.
		{"http://example.com../", false, "not a host name"},
		{"http://127.0.0.1../", false, "not a host name"},
		{"http://localhost../", false, "not a host name"},
		{"http://example.com。。/", false, "not a host name"},
		{"http://a..example.com/", false, "not a host name"},
		{"http://.example.com/", false, "not a host name"},
		{"http://-a.example.com/", false, "not a host name"},
		{"http://a-.example.com/", false, "not a host name"},
		{"http://exa!mple.com/", false, "not a host name"},
		{"http://exa$mple.com/", false, "not a host name"},
		{"http://" + strings.Repeat("a", 64) + ".example/", false, "not a host name"},
		{"http://" + strings.Repeat("a.", 126) + "com/", false, "not a host name"},
		{"http://ex%C2%A0ample.com/", false, "not a host name"},
	} {
		err := webhooks.CheckURL(tt.url, false)
		require.Error(t, err, tt.url)
		require.Contains(t, err.Error(), tt.why, tt.url)
		require.Equal(t, tt.priv, webhooks.IsPrivateTarget(err), "%s: %v", tt.url, err)
		require.Equal(t, tt.priv, webhooks.CheckURL(tt.url, true) == nil, "%s with private targets", tt.url)
	}
	for _, url := range []string{
		"https://example.com/hooks",
		"https://example.com./hooks",
		"https://ＥＸＡＭＰＬＥ.com/hooks",
		"https://example。com/hooks",
		"https://bücher.de/hooks",
		"https://xn--bcher-kva.de/hooks",
		"http://hooks_1.example.com:8080/",
		"http://intranet/",
		"http://" + strings.Repeat("a", 63) + ".example/",
		"http://" + strings.Repeat("a.", 125) + "com/",
		"http://93.184.215.14/",
		"http://192.0.3.1/",
		"http://198.51.101.1/",
		"http://203.0.112.1/",
		"http://[2606:4700:4700::1111]/",
		"http://[2001:db9::1]/",
		"http://[2001:3::1]/",
		"http://[101::1]/",
		"http://[::ffff:93.184.215.14]/",
	} {
		require.NoError(t, webhooks.CheckURL(url, false), url)
		require.NoError(t, webhooks.CheckURL(url, true), url)
	}
}

// The address about to be dialled is checked against the same list as
// registration: every refused range, and none of the public addresses.
func TestCheckDialSharesTheList(t *testing.T) {
	t.Parallel()
	for _, a := range []string{"127.0.0.1", "::ffff:127.0.0.1", "10.0.0.1", "192.0.2.1", "198.51.100.7", "203.0.113.9",
		"2001:db8::1", "3fff::1", "2001:2::1", "100::1", "fec0::1", "::ffff:192.0.2.1", "192.88.99.1", "2001::1"} {
		err := webhooks.CheckDial("tcp", net.JoinHostPort(a, "443"), nil)
		require.True(t, webhooks.IsPrivateTarget(err), "%s: %v", a, err)
		require.False(t, webhooks.PublicAddr(netip.MustParseAddr(a)), a)
	}
	for _, a := range []string{"93.184.215.14", "2606:4700:4700::1111", "192.0.3.1"} {
		require.NoError(t, webhooks.CheckDial("tcp", net.JoinHostPort(a, "443"), nil), a)
	}
}

// An address of this host is refused, when an endpoint is registered and
// when a delivery dials it, even a public one: it reaches the host's own
// services. Not parallel: it gives the host two public addresses.
func TestCheckURLRefusesTheHostsOwnAddresses(t *testing.T) {
	own, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, o := range own {
		a, ok := netip.AddrFromSlice(o.(*net.IPNet).IP)
		require.True(t, ok)
		require.False(t, webhooks.PublicAddr(a), "%s", a)
	}

	webhooks.SetHostAddrs(t, "93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")
	for _, tt := range []struct{ url, dialled string }{
		{"http://93.184.215.14/hooks", "93.184.215.14:80"},
		{"http://９３.１８４.２１５.１４/hooks", "93.184.215.14:80"},
		{"http://[::ffff:93.184.215.14]/hooks", "[::ffff:93.184.215.14]:80"},
		{"https://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:8443/", "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:8443"},
	} {
		err := webhooks.CheckURL(tt.url, false)
		require.True(t, webhooks.IsPrivateTarget(err), "%s: %v", tt.url, err)
		require.ErrorContains(t, err, "an address of this host", tt.url)
		require.NoError(t, webhooks.CheckURL(tt.url, true), tt.url)
		require.True(t, webhooks.IsPrivateTarget(webhooks.CheckDial("tcp", tt.dialled, nil)), tt.dialled)
	}
	require.NoError(t, webhooks.CheckURL("http://93.184.215.15/hooks", false), "another public address")
}
