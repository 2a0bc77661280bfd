package webhooks_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/webhooktest"
	"github.com/valruns/valruns/webhooks"
)

// receiver is a real HTTP server that checks every delivery's Standard
// Webhooks headers against the secrets and counts the deliveries.
type receiver struct {
	*httptest.Server
	hits atomic.Int64
}

func newReceiver(t *testing.T, secrets []string, answer func(n int64, w http.ResponseWriter)) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := rc.hits.Add(1)
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		ts, err := strconv.ParseInt(r.Header.Get("webhook-timestamp"), 10, 64)
		want, serr := webhooks.Sign(secrets, r.Header.Get("webhook-id"), ts, body)
		if err != nil || serr != nil || r.Method != http.MethodPost || r.Header.Get("webhook-signature") != want ||
			r.Header.Get("Content-Type") != "application/json" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		answer(n, w)
	}))
	t.Cleanup(rc.Close)
	return rc
}

var (
	vector = webhooktest.Secret
	other  = webhooktest.OtherSecret
	event  = []byte(`{"id":"evt_1","type":"validation_run.finished"}`)
)

func TestSendSignsAndCountsA2xx(t *testing.T) {
	t.Parallel()
	ok := newReceiver(t, []string{vector, other}, func(int64, http.ResponseWriter) {})
	s := webhooks.NewSender(true, 0)
	res := s.Send(context.Background(), ok.URL+"/hooks", "evt_1", []string{vector, other}, event, time.Now())
	require.NoError(t, res.Err)
	require.True(t, res.Delivered)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.EqualValues(t, 1, ok.hits.Load())

	// A receiver that checks only the new secret still verifies (its
	// signature is among the two); one that knows neither refuses.
	onlyOld := newReceiver(t, []string{other}, func(int64, http.ResponseWriter) {})
	res = s.Send(context.Background(), onlyOld.URL, "evt_1", []string{vector}, event, time.Now())
	require.False(t, res.Delivered)
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
}

// A receiver that fails twice and then answers 200 gets three attempts of
// one event, the same webhook-id and a valid signature each time.
func TestSendFailuresAreRetriableAttempts(t *testing.T) {
	t.Parallel()
	var ids []string
	flaky := newReceiver(t, []string{vector}, func(n int64, w http.ResponseWriter) {
		if n <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	inner := flaky.Config.Handler
	flaky.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ids = append(ids, r.Header.Get("webhook-id"))
		inner.ServeHTTP(w, r)
	})
	s := webhooks.NewSender(true, 0)
	var results []webhooks.Result
	for range 3 {
		results = append(results, s.Send(context.Background(), flaky.URL, "evt_abc", []string{vector}, event, time.Now()))
	}
	require.Equal(t, []webhooks.Result{{StatusCode: 503}, {StatusCode: 503}, {Delivered: true, StatusCode: 200}}, results)
	require.Equal(t, []string{"evt_abc", "evt_abc", "evt_abc"}, ids)
}

func TestSendNeverFollowsARedirect(t *testing.T) {
	t.Parallel()
	target := newReceiver(t, []string{vector}, func(int64, http.ResponseWriter) {})
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirect.Close)
	res := webhooks.NewSender(true, 0).Send(context.Background(), redirect.URL, "evt_1", []string{vector}, event, time.Now())
	require.False(t, res.Delivered, "a redirect is not a delivery")
	require.Equal(t, http.StatusTemporaryRedirect, res.StatusCode)
	require.Zero(t, target.hits.Load(), "the redirect was followed")
}

func TestSendTimesOut(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	slow := newReceiver(t, []string{vector}, func(int64, http.ResponseWriter) { <-release })
	t.Cleanup(func() { close(release) })
	res := webhooks.NewSender(true, 200*time.Millisecond).Send(context.Background(), slow.URL, "evt_1", []string{vector}, event, time.Now())
	require.False(t, res.Delivered)
	require.Error(t, res.Err)
	require.Zero(t, res.StatusCode)
	require.Equal(t, webhooks.ReasonTimedOut, webhooks.Reason(res.Err))
}

// A 2xx with a huge answer is a delivery; the sender reads a bounded part
// of it (MaxAnswerBytes) and does not wait for the rest.
func TestSendReadsABoundedAnswer(t *testing.T) {
	t.Parallel()
	stop := make(chan struct{})
	var written atomic.Int64
	big := newReceiver(t, []string{vector}, func(_ int64, w http.ResponseWriter) {
		w.WriteHeader(http.StatusOK)
		chunk := []byte(strings.Repeat("x", 32<<10))
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil || written.Load() > 1<<30 {
				return
			}
		}
	})
	t.Cleanup(func() { close(stop) })
	res := webhooks.NewSender(true, time.Minute).Send(context.Background(), big.URL, "evt_1", []string{vector}, event, time.Now())
	require.NoError(t, res.Err)
	require.True(t, res.Delivered)
	require.Less(t, written.Load(), int64(1<<30), "the sender read the endless answer to its end")
}

// Without WEBHOOK_ALLOW_PRIVATE_TARGETS, the address being dialled is
// checked: a loopback address, and a name that resolves to one at send
// time, are refused before anything is sent.
func TestSendRefusesPrivateTargetsAtConnect(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, []string{vector}, func(int64, http.ResponseWriter) {})
	_, port, err := net.SplitHostPort(rc.Listener.Addr().String())
	require.NoError(t, err)
	strict := webhooks.NewSender(false, 0)
	for _, url := range []string{rc.URL, "http://localhost:" + port + "/hooks"} {
		res := strict.Send(context.Background(), url, "evt_1", []string{vector}, event, time.Now())
		require.False(t, res.Delivered, url)
		require.True(t, webhooks.IsPrivateTarget(res.Err), "%s: %v", url, res.Err)
	}
	require.Zero(t, rc.hits.Load(), "a private target was sent to")

	res := webhooks.NewSender(true, 0).Send(context.Background(), "http://localhost:"+port+"/hooks", "evt_1", []string{vector}, event, time.Now())
	require.True(t, res.Delivered, "%v", res.Err)
}

// Without WEBHOOK_ALLOW_PRIVATE_TARGETS, the IPv6 forms that reach an IPv4
// address (IPv4-compatible, 6to4, Teredo, NAT64) are refused when dialled,
// like the loopback they hide: nothing is sent.
func TestSendRefusesIPv6FormsOfIPv4AtConnect(t *testing.T) {
	t.Parallel()
	strict := webhooks.NewSender(false, 2*time.Second)
	for _, host := range []string{"[::127.0.0.1]", "[::7f00:1]", "[::ffff:0:7f00:1]", "[2002:7f00:1::]", "[2001:0:7f00:1::]",
		"[64:ff9b::7f00:1]", "[64:ff9b:1::7f00:1]", "192.88.99.1", "[::ffff:127.0.0.1]"} {
		res := strict.Send(context.Background(), "http://"+host+":18998/h", "evt_1", []string{vector}, event, time.Now())
		require.False(t, res.Delivered, host)
		require.True(t, webhooks.IsPrivateTarget(res.Err), "%s: %v", host, res.Err)
		require.Equal(t, webhooks.ReasonNotAllowed, webhooks.Reason(res.Err), host)
	}
}

// A delivery checks its URL as registration does (an endpoint stored
// before a rule was added): a documentation address, or 127.0.0.1 in full
// width, is refused when dialled; a name a resolver would not take (two
// final dots) is not sent to, private targets allowed or not.
func TestSendChecksTheURLAsRegistrationDoes(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, []string{vector}, func(int64, http.ResponseWriter) {})
	_, port, err := net.SplitHostPort(rc.Listener.Addr().String())
	require.NoError(t, err)
	strict := webhooks.NewSender(false, 2*time.Second)
	lax := webhooks.NewSender(true, 2*time.Second)
	for _, tt := range []struct {
		send   *webhooks.Sender
		url    string
		reason string
	}{
		{strict, "http://192.0.2.1:" + port + "/h", webhooks.ReasonNotAllowed},
		{strict, "http://[2001:db8::1]:" + port + "/h", webhooks.ReasonNotAllowed},
		{strict, "http://１２７.０.０.１:" + port + "/h", webhooks.ReasonNotAllowed},
		{strict, "http://127.0.0.1..:" + port + "/h", webhooks.ReasonBadURL},
		{lax, "http://127.0.0.1..:" + port + "/h", webhooks.ReasonBadURL},
		{lax, "http://localhost..:" + port + "/h", webhooks.ReasonBadURL},
	} {
		res := tt.send.Send(context.Background(), tt.url, "evt_1", []string{vector}, event, time.Now())
		require.False(t, res.Delivered, tt.url)
		require.Equal(t, tt.reason, webhooks.Reason(res.Err), "%s: %v", tt.url, res.Err)
	}
	require.Zero(t, rc.hits.Load())

	res := lax.Send(context.Background(), "http://１２７.０.０.１:"+port+"/h", "evt_1", []string{vector}, event, time.Now())
	require.True(t, res.Delivered, "%v", res.Err)
}

// What a delivery records of a failed attempt is a coarse reason: no
// address the name resolved to, no resolver, no port, whatever the
// failure. The errors are the ones real attempts get.
func TestReasonNamesNoAddress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	strict := webhooks.NewSender(false, 2*time.Second)
	lax := webhooks.NewSender(true, 2*time.Second)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens: refused
	hangUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = c.Close()
		}
	}))
	t.Cleanup(hangUp.Close)
	tlsOnly := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(tlsOnly.Close)
	_, tlsPort, err := net.SplitHostPort(tlsOnly.Listener.Addr().String())
	require.NoError(t, err)

	for _, tt := range []struct {
		name   string
		send   *webhooks.Sender
		url    string
		reason string
	}{
		{"a name that resolves to loopback", strict, "http://localhost:" + tlsPort + "/h", webhooks.ReasonNotAllowed},
		{"a private address", strict, "http://10.0.0.1:18998/h", webhooks.ReasonNotAllowed},
		{"a name that does not resolve", lax, "http://no-such-host.invalid:18998/h", webhooks.ReasonUnresolved},
		{"a numeric spelling looked up as a name", lax, "http://0x7f000001:18998/h", ""}, // resolvers differ: any coarse reason
		{"nothing listens", lax, "http://" + closed + "/h", webhooks.ReasonRefused},
		{"the receiver hangs up", lax, hangUp.URL, webhooks.ReasonClosed},
		{"a certificate nobody vouches for", lax, tlsOnly.URL, webhooks.ReasonTLS},
	} {
		res := tt.send.Send(ctx, tt.url, "evt_1", []string{vector}, event, time.Now())
		require.Error(t, res.Err, tt.name)
		got := webhooks.Reason(res.Err)
		if tt.reason != "" {
			require.Equal(t, tt.reason, got, "%s: %v", tt.name, res.Err)
		}
		require.NotContains(t, got, ":", "%s: %q", tt.name, got)
		require.False(t, strings.ContainsAny(got, "0123456789"), "%s: %q names an address", tt.name, got)
	}

	// As the probes saw them.
	for _, err := range []error{
		&net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 18998},
			Err: fmt.Errorf("%w: 10.0.0.1", webhooks.ErrPrivateTarget)},
		&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "0x7f000001", Server: "10.255.255.53:53", IsNotFound: true}},
	} {
		got := webhooks.Reason(err)
		require.NotEqual(t, webhooks.ReasonFailed, got, "%v", err)
		require.False(t, strings.ContainsAny(got, "0123456789"), "%v: %q", err, got)
	}
}
