package cli

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A client that connects, then is slow to write its request (a starved
// machine), still gets its answer: the header time counts from the
// request's first bytes, not from the accept.
func TestServeAPIHeaderTimeFromFirstBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := apiServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	srv.ReadHeaderTimeout = 500 * time.Millisecond
	srv.ReadTimeout = 500 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- serveAPI(srv, ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })

	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	time.Sleep(3 * srv.ReadHeaderTimeout) // connected, not yet writing
	_, err = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "the server closed a connection whose request came late")
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
}

// A connection that never sends a byte is closed after the idle time, and
// closing the listener closes the ones still waiting.
func TestFirstBytesListenerClosesSilentConnections(t *testing.T) {
	listen := func(idle time.Duration) (*firstBytesListener, chan net.Conn) {
		inner, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ln := newFirstBytesListener(inner, idle)
		t.Cleanup(func() { _ = ln.Close() })
		accepted := make(chan net.Conn, 2)
		go func() {
			defer close(accepted)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted <- c
			}
		}()
		return ln, accepted
	}
	dial := func(ln net.Listener) net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
		return c
	}

	short, _ := listen(200 * time.Millisecond)
	_, err := dial(short).Read(make([]byte, 1))
	require.Error(t, err, "closed after the idle time")

	ln, accepted := listen(time.Minute)
	waiting := dial(ln)
	talker := dial(ln)
	_, err = talker.Write([]byte("hello"))
	require.NoError(t, err)
	c := <-accepted
	require.NotNil(t, c)
	b := make([]byte, 5)
	_, err = c.Read(b[:1])
	require.NoError(t, err)
	_, err = c.Read(b[1:])
	require.NoError(t, err)
	require.True(t, strings.HasPrefix("hello", string(b[:2])), "the first byte is read again first: %q", b)
	_ = c.Close()

	require.NoError(t, ln.Close())
	_, ok := <-accepted
	require.False(t, ok, "Accept ends with the listener")
	_, err = waiting.Read(make([]byte, 1))
	require.Error(t, err, "a connection still waiting for its first byte is closed with the listener")
}
