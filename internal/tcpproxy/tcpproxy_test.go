package tcpproxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/internal/tcpproxy"
)

// A late proxy passes the bytes both ways (its delay read at each answer),
// and once closed it has closed its connections and refuses new ones.
func TestLateThenClosed(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "pong") }))
	t.Cleanup(up.Close)
	var delay atomic.Int64
	p := tcpproxy.New(t, up.Listener.Addr().String(), tcpproxy.Late(func() time.Duration { return time.Duration(delay.Load()) }))
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second))) // a bound on waiting, not a timing
	r := bufio.NewReader(c)
	for _, d := range []time.Duration{0, time.Millisecond} {
		delay.Store(int64(d))
		_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: up\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(r, nil)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, "pong", strings.TrimSpace(string(body)))
	}

	p.Close()
	_, err = r.ReadByte()
	require.ErrorIs(t, err, io.EOF, "an open connection is closed")
	_, err = net.Dial("tcp", p.Addr())
	require.Error(t, err, "a new one is refused")
	p.Close()
}
