// Package tcpproxy is a TCP proxy for tests that put it between a client
// and a real server (PostgreSQL, Redis) to hold, drop or delay the bytes
// on their way, as a hung server or a slow network does.
package tcpproxy

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Proxy listens on a loopback port and joins each connection it accepts to
// a connection of its own to the upstream server.
type Proxy struct {
	ln net.Listener

	mu     sync.Mutex
	conns  []net.Conn // both ends of every connection made
	closed bool
}

// New starts a proxy to upstream (host:port). For each client it accepts it
// dials upstream and hands both ends to serve, on the accept loop: serve
// starts the goroutines that pass the bytes and returns. A client that
// upstream refuses is closed. The proxy closes at the end of the test.
func New(t testing.TB, upstream string, serve func(client, server net.Conn)) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{ln: ln}
	go p.accept(upstream, serve)
	t.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept(upstream string, serve func(client, server net.Conn)) {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, u) {
			return
		}
		serve(c, u)
	}
}

// track keeps c and u for Close; once the proxy is closed it closes them
// instead and answers false.
func (p *Proxy) track(c, u net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_, _ = c.Close(), u.Close()
		return false
	}
	p.conns = append(p.conns, c, u)
	return true
}

// Addr is the host:port that clients dial.
func (p *Proxy) Addr() string {
	return p.ln.Addr().String()
}

// Close stops accepting (a client is then refused, as by a server that is
// down) and closes every connection made. It may be called more than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	_ = p.ln.Close()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Late is a serve func for New: the client's bytes pass at once, and each
// read of the server's answers is passed on delay() late. delay is called
// for every read, so a test can change it while connections are open.
func Late(delay func() time.Duration) func(client, server net.Conn) {
	return func(c, u net.Conn) {
		go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
		go func() {
			defer c.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := u.Read(buf)
				if n > 0 {
					time.Sleep(delay())
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}
