package cli

import (
	"errors"
	"net"
	"sync"
	"time"
)

// firstBytesListener hands the HTTP server a connection only once its client
// has sent its first byte, so that the server's ReadHeaderTimeout (and
// ReadTimeout) count from the request's first bytes, as net/http already
// counts them for a kept-alive connection's next request, not from the
// accept. On a starved machine a client may connect well before it writes:
// counted from the accept, its header time ran out first, and the server
// closed a connection the client was still writing to, which the client
// saw as a broken pipe with no answer, where the overload bounds promise a
// 503. A connection that sends nothing within idle is closed, as an idle
// kept-alive one is.
type firstBytesListener struct {
	net.Listener
	idle  time.Duration
	ready chan net.Conn
	errs  chan error
	done  chan struct{} // closed by Close
	start sync.Once
	stop  sync.Once

	mu      sync.Mutex
	waiting map[net.Conn]struct{} // accepted, no byte yet: closed by Close
}

func newFirstBytesListener(ln net.Listener, idle time.Duration) *firstBytesListener {
	return &firstBytesListener{Listener: ln, idle: idle, ready: make(chan net.Conn), errs: make(chan error),
		done: make(chan struct{}), waiting: map[net.Conn]struct{}{}}
}

// Accept returns the next connection whose client has sent a byte.
func (l *firstBytesListener) Accept() (net.Conn, error) {
	l.start.Do(func() { go l.acceptLoop() })
	select {
	case c := <-l.ready:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting and closes the connections still waiting for
// their first byte (the server knows nothing of them yet).
func (l *firstBytesListener) Close() error {
	err := l.Listener.Close()
	l.stop.Do(func() {
		close(l.done)
		l.mu.Lock()
		defer l.mu.Unlock()
		for c := range l.waiting {
			_ = c.Close()
		}
	})
	return err
}

func (l *firstBytesListener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			select {
			case l.errs <- err: // the server retries a temporary error itself
			case <-l.done:
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		l.mu.Lock()
		select {
		case <-l.done:
			l.mu.Unlock()
			_ = c.Close()
			return
		default:
		}
		l.waiting[c] = struct{}{}
		l.mu.Unlock()
		go l.awaitFirstByte(c)
	}
}

func (l *firstBytesListener) awaitFirstByte(c net.Conn) {
	var b [1]byte
	_ = c.SetReadDeadline(time.Now().Add(l.idle))
	_, err := c.Read(b[:])
	_ = c.SetReadDeadline(time.Time{})
	l.mu.Lock()
	delete(l.waiting, c)
	l.mu.Unlock()
	if err != nil {
		_ = c.Close() // nothing sent, or closed by Close
		return
	}
	select {
	case l.ready <- &firstByteConn{Conn: c, first: b[0], unread: true}:
	case <-l.done:
		_ = c.Close()
	}
}

// firstByteConn is a connection whose first byte was read already: it
// reads it again first.
type firstByteConn struct {
	net.Conn
	first  byte
	unread bool
}

func (c *firstByteConn) Read(p []byte) (int, error) {
	if c.unread && len(p) > 0 {
		c.unread = false
		p[0] = c.first
		return 1, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite keeps net/http's lingering close (half-close, then read what
// the client still sends for a moment) working through the wrapper.
func (c *firstByteConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
