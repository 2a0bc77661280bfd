package main

// The statement capture: a PostgreSQL wire-protocol proxy between valruns
// serve and its database. It forwards every byte unchanged and decodes a
// copy of both directions, so it records the SQL and the parameter values
// exactly as the server sent them, which statements travelled together
// (one round trip), and which round trips only prepared a statement. It
// needs no change to the server, to its code, or to the PostgreSQL
// configuration (statement logging would need a server log the harness
// can read, and cannot show round trips or pipelining).

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgtype"
)

// wireParam is one bound parameter in its text form.
type wireParam struct {
	OID  uint32
	Null bool
	// Text is the value as PostgreSQL's text input would read it (binary
	// values are decoded and re-encoded as text).
	Text string
	// Undecoded: a binary value of a type the decoder does not know; Text is
	// its hex form and cannot be replayed as is.
	Undecoded bool
}

// wireStmt is one executed statement.
type wireStmt struct {
	Conn  int
	Burst int // the client's burst on Conn: statements sent without waiting for an answer share one
	// Txn numbers the extended-protocol transactions of Conn: statements
	// between two Syncs run in one implicit transaction (a Query is one of
	// its own), whatever bursts they were sent in.
	Txn    int
	SQL    string
	Params []wireParam
	Simple bool // a simple-protocol Query (no parameters; may hold several statements)
	// Columns and the first rows of its result, in text form; RowCount
	// counts every row.
	Columns  []string
	Rows     [][]wireParam
	RowCount int

	cols          []column
	resultFormats []int16
}

// column is one column of a result.
type column struct {
	name string
	oid  uint32
}

// keptRows is how many result rows a statement keeps.
const keptRows = 2

// wireEvent is one client message, in the order they reached the proxy.
type wireEvent struct {
	Conn  int
	Burst int
	Txn   int
	Type  byte      // the message type: 'P' Parse, 'B' Bind, 'E' Execute, 'S' Sync, 'Q' Query...
	Stmt  *wireStmt // set for 'E' and 'Q'
	Err   string    // set for server errors ('!' events)
}

// capture is the proxy. Listen, point the server at Addr, then read
// Window(mark before, mark after) around each request.
type capture struct {
	upstream string
	ln       net.Listener
	typeMap  *pgtype.Map

	mu     sync.Mutex
	events []wireEvent
	conns  []net.Conn
	nconn  int
	wg     sync.WaitGroup
	closed atomic.Bool
}

// newCapture listens on a free loopback port and proxies to upstream (host:port).
func newCapture(upstream string) (*capture, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &capture{upstream: upstream, ln: ln, typeMap: pgtype.NewMap()}
	c.wg.Add(1)
	go c.accept()
	return c, nil
}

// Addr is where clients connect.
func (c *capture) Addr() *net.TCPAddr { return c.ln.Addr().(*net.TCPAddr) }

// Close stops listening and closes every proxied connection.
func (c *capture) Close() {
	c.closed.Store(true)
	_ = c.ln.Close()
	c.mu.Lock()
	for _, cn := range c.conns {
		_ = cn.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// Mark is the position of the next event: events between two marks are
// what the client sent in between.
func (c *capture) Mark() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.events)
}

// Window returns the events recorded between two marks.
func (c *capture) Window(from, to int) []wireEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]wireEvent(nil), c.events[from:to]...)
}

func (c *capture) accept() {
	defer c.wg.Done()
	for {
		client, err := c.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", c.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		c.mu.Lock()
		c.nconn++
		st := &connState{id: c.nconn, cap: c, stmts: map[string]*prepared{}, portals: map[string]*bound{}, startup: true}
		c.conns = append(c.conns, client, server)
		c.mu.Unlock()
		c.wg.Add(2)
		go c.pump(client, server, st, true)
		go c.pump(server, client, st, false)
	}
}

// pump copies src to dst, decoding each chunk before forwarding it, so the
// state a later message needs (a statement's parameter types) is known
// before the peer can answer it.
func (c *capture) pump(src, dst net.Conn, st *connState, fromClient bool) {
	defer c.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if fromClient {
				st.clientChunk(buf[:n])
			} else {
				st.serverChunk(buf[:n])
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

type prepared struct {
	sql  string
	oids []uint32
	cols []column
}

type bound struct {
	stmt          *prepared
	formats       []int16
	params        [][]byte // nil: NULL
	resultFormats []int16
	cols          []column // from a Describe of the portal
}

// describe is a Describe awaiting its answer.
type describe struct {
	kind    byte // 'S' statement, 'P' portal
	stmt    *prepared
	portal  *bound
	gotDesc bool // 'S': its ParameterDescription has arrived
}

// connState decodes one proxied connection. Both pumps lock the capture's
// mutex around it.
type connState struct {
	id  int
	cap *capture

	cbuf, sbuf  []byte
	startup     bool // the client has not sent its startup message yet
	sslAnswer   bool // the server's next byte answers an SSLRequest/GSSENCRequest
	opaque      bool // TLS or a protocol we cannot follow: stop decoding
	serverSpoke bool
	burst       int
	txn         int // Syncs and Queries the client sent (wireStmt.Txn)

	stmts           map[string]*prepared
	portals         map[string]*bound
	pendingDescribe []*describe
	pendingExec     []*wireStmt // executed statements whose results are still arriving
}

const (
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
	codeCancelRequest = 80877102
)

func (st *connState) clientChunk(b []byte) {
	c := st.cap
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.opaque {
		return
	}
	if st.serverSpoke {
		st.burst++
		st.serverSpoke = false
	}
	st.cbuf = append(st.cbuf, b...)
	for {
		if st.startup {
			if len(st.cbuf) < 8 {
				return
			}
			n := int(binary.BigEndian.Uint32(st.cbuf))
			if n < 8 || n > 1<<20 {
				st.opaque = true
				return
			}
			if len(st.cbuf) < n {
				return
			}
			switch binary.BigEndian.Uint32(st.cbuf[4:]) {
			case codeSSLRequest, codeGSSENCRequest:
				st.sslAnswer = true // another startup message follows
			case codeCancelRequest:
			default:
				st.startup = false
			}
			st.cbuf = st.cbuf[n:]
			continue
		}
		if len(st.cbuf) < 5 {
			return
		}
		n := int(binary.BigEndian.Uint32(st.cbuf[1:]))
		if n < 4 {
			st.opaque = true
			return
		}
		if len(st.cbuf) < 1+n {
			return
		}
		st.clientMessage(st.cbuf[0], st.cbuf[5:1+n])
		st.cbuf = st.cbuf[1+n:]
	}
}

func (st *connState) serverChunk(b []byte) {
	c := st.cap
	c.mu.Lock()
	defer c.mu.Unlock()
	st.serverSpoke = true
	if st.opaque {
		return
	}
	if st.sslAnswer {
		st.sslAnswer = false
		if b[0] != 'N' {
			st.opaque = true // TLS from here on
			return
		}
		b = b[1:]
	}
	st.sbuf = append(st.sbuf, b...)
	for len(st.sbuf) >= 5 {
		n := int(binary.BigEndian.Uint32(st.sbuf[1:]))
		if n < 4 {
			st.opaque = true
			return
		}
		if len(st.sbuf) < 1+n {
			return
		}
		st.serverMessage(st.sbuf[0], st.sbuf[5:1+n])
		st.sbuf = st.sbuf[1+n:]
	}
}

// reader decodes the fields of one message body.
type reader struct {
	b   []byte
	err error
}

func (r *reader) cstring() string {
	i := strings.IndexByte(string(r.b), 0)
	if i < 0 {
		r.err = errors.New("unterminated string")
		return ""
	}
	s := string(r.b[:i])
	r.b = r.b[i+1:]
	return s
}

func (r *reader) int16() int16 {
	if len(r.b) < 2 {
		r.err = errors.New("short message")
		return 0
	}
	v := int16(binary.BigEndian.Uint16(r.b))
	r.b = r.b[2:]
	return v
}

func (r *reader) int32() int32 {
	if len(r.b) < 4 {
		r.err = errors.New("short message")
		return 0
	}
	v := int32(binary.BigEndian.Uint32(r.b))
	r.b = r.b[4:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if n < 0 || len(r.b) < n {
		r.err = errors.New("short message")
		return nil
	}
	v := append([]byte(nil), r.b[:n]...)
	r.b = r.b[n:]
	return v
}

func (st *connState) record(ev wireEvent) {
	ev.Conn, ev.Burst, ev.Txn = st.id, st.burst, st.txn
	st.cap.events = append(st.cap.events, ev)
}

func (st *connState) clientMessage(typ byte, body []byte) {
	r := &reader{b: body}
	switch typ {
	case 'P': // Parse
		name, sql := r.cstring(), r.cstring()
		n := r.int16()
		oids := make([]uint32, 0, n)
		for range n {
			oids = append(oids, uint32(r.int32()))
		}
		if r.err == nil {
			st.stmts[name] = &prepared{sql: sql, oids: oids}
		}
	case 'B': // Bind
		portal, name := r.cstring(), r.cstring()
		nf := r.int16()
		formats := make([]int16, 0, nf)
		for range nf {
			formats = append(formats, r.int16())
		}
		np := r.int16()
		params := make([][]byte, 0, np)
		for range np {
			l := r.int32()
			if l < 0 {
				params = append(params, nil)
				continue
			}
			v := r.bytes(int(l))
			if v == nil {
				v = []byte{}
			}
			params = append(params, v)
		}
		nr := r.int16()
		var resultFormats []int16
		for range nr {
			resultFormats = append(resultFormats, r.int16())
		}
		if p := st.stmts[name]; p != nil && r.err == nil {
			st.portals[portal] = &bound{stmt: p, formats: formats, params: params, resultFormats: resultFormats}
		}
	case 'D': // Describe
		if len(body) == 0 {
			break
		}
		kind := body[0]
		r.b = body[1:]
		name := r.cstring()
		switch kind {
		case 'S':
			st.pendingDescribe = append(st.pendingDescribe, &describe{kind: 'S', stmt: st.stmts[name]})
		case 'P':
			st.pendingDescribe = append(st.pendingDescribe, &describe{kind: 'P', portal: st.portals[name]})
		}
	case 'C': // Close
		if len(body) == 0 {
			break
		}
		kind := body[0]
		r.b = body[1:]
		name := r.cstring()
		if kind == 'S' {
			delete(st.stmts, name)
		} else {
			delete(st.portals, name)
		}
	case 'E': // Execute
		portal := r.cstring()
		b := st.portals[portal]
		if b == nil {
			break
		}
		s := &wireStmt{SQL: b.stmt.sql, cols: b.cols, resultFormats: b.resultFormats}
		if s.cols == nil {
			s.cols = b.stmt.cols
		}
		for i, raw := range b.params {
			s.Params = append(s.Params, st.cap.decodeParam(b.stmt.oid(i), format(b.formats, i), raw))
		}
		for _, c := range s.cols {
			s.Columns = append(s.Columns, c.name)
		}
		st.pendingExec = append(st.pendingExec, s)
		st.record(wireEvent{Type: typ, Stmt: s})
		return
	case 'Q': // simple Query
		sql := r.cstring()
		s := &wireStmt{SQL: sql, Simple: true}
		st.pendingExec = append(st.pendingExec, s)
		st.record(wireEvent{Type: typ, Stmt: s})
		st.txn++
		return
	}
	st.record(wireEvent{Type: typ})
	if typ == 'S' { // Sync: the implicit transaction ends
		st.txn++
	}
}

func (st *connState) serverMessage(typ byte, body []byte) {
	r := &reader{b: body}
	switch typ {
	case 't': // ParameterDescription: the answer to the oldest Describe of a statement
		n := r.int16()
		oids := make([]uint32, 0, n)
		for range n {
			oids = append(oids, uint32(r.int32()))
		}
		if d := st.frontDescribe(); d != nil && d.kind == 'S' {
			d.gotDesc = true
			if d.stmt != nil && r.err == nil {
				d.stmt.oids = oids
			}
		}
	case 'T', 'n': // RowDescription / NoData
		var cols []column
		if typ == 'T' {
			n := r.int16()
			for range n {
				name := r.cstring()
				r.int32() // table oid
				r.int16() // attribute number
				oid := uint32(r.int32())
				r.int16() // type length
				r.int32() // type modifier
				r.int16() // format
				cols = append(cols, column{name: name, oid: oid})
			}
		}
		if r.err != nil {
			break
		}
		if d := st.frontDescribe(); d != nil {
			st.pendingDescribe = st.pendingDescribe[1:]
			switch {
			case d.kind == 'S' && d.stmt != nil:
				d.stmt.cols = cols
			case d.kind == 'P' && d.portal != nil:
				d.portal.cols = cols
			}
		} else if len(st.pendingExec) > 0 && st.pendingExec[0].Simple {
			s := st.pendingExec[0]
			s.cols = cols
			s.Columns = nil
			for _, c := range cols {
				s.Columns = append(s.Columns, c.name)
			}
		}
	case 'D': // DataRow of the oldest statement still answering
		if len(st.pendingExec) == 0 {
			break
		}
		s := st.pendingExec[0]
		s.RowCount++
		if len(s.Rows) >= keptRows {
			break
		}
		n := int(r.int16())
		row := make([]wireParam, 0, n)
		for i := range n {
			l := r.int32()
			var raw []byte
			if l >= 0 {
				raw = r.bytes(int(l))
				if raw == nil {
					raw = []byte{}
				}
			}
			var oid uint32
			if i < len(s.cols) {
				oid = s.cols[i].oid
			}
			f := format(s.resultFormats, i)
			if s.Simple {
				f = 0
			}
			row = append(row, st.cap.decodeParam(oid, f, raw))
		}
		if r.err == nil {
			s.Rows = append(s.Rows, row)
		}
	case 'C', 'I', 's': // CommandComplete, EmptyQueryResponse, PortalSuspended
		// A simple query may hold several statements: it ends at ReadyForQuery.
		if len(st.pendingExec) > 0 && !st.pendingExec[0].Simple {
			st.pendingExec = st.pendingExec[1:]
		}
	case 'Z': // ReadyForQuery: nothing is pending any more
		st.pendingDescribe = nil
		st.pendingExec = nil
	case 'E': // ErrorResponse
		var msg []string
		for len(r.b) > 1 && r.err == nil {
			field := r.b[0]
			r.b = r.b[1:]
			v := r.cstring()
			if field == 'M' || field == 'C' {
				msg = append(msg, v)
			}
		}
		st.record(wireEvent{Type: '!', Err: strings.Join(msg, " ")})
		// The server skips the rest up to the next Sync.
		st.pendingExec = nil
		st.pendingDescribe = nil
	}
}

// frontDescribe is the oldest Describe still awaiting its answer.
func (st *connState) frontDescribe() *describe {
	if len(st.pendingDescribe) == 0 {
		return nil
	}
	return st.pendingDescribe[0]
}

func (p *prepared) oid(i int) uint32 {
	if i < len(p.oids) {
		return p.oids[i]
	}
	return 0
}

func format(formats []int16, i int) int16 {
	switch {
	case len(formats) == 0:
		return pgtype.TextFormatCode
	case len(formats) == 1:
		return formats[0]
	case i < len(formats):
		return formats[i]
	}
	return pgtype.TextFormatCode
}

// Type OIDs decoded specially: pgtype would re-encode JSON (losing its bytes).
const (
	oidJSON  = 114
	oidJSONB = 3802
)

// decodeParam turns a bound value into its text form.
func (c *capture) decodeParam(oid uint32, format int16, raw []byte) wireParam {
	p := wireParam{OID: oid}
	switch {
	case raw == nil:
		p.Null = true
	case format == pgtype.TextFormatCode:
		p.Text = string(raw)
	case oid == oidJSON:
		p.Text = string(raw)
	case oid == oidJSONB && len(raw) > 0 && raw[0] == 1:
		p.Text = string(raw[1:])
	default:
		txt, err := binaryToText(c.typeMap, oid, raw)
		if err != nil {
			p.Text, p.Undecoded = hex.EncodeToString(raw), true
		} else {
			p.Text = txt
		}
	}
	return p
}

func binaryToText(m *pgtype.Map, oid uint32, raw []byte) (string, error) {
	t, ok := m.TypeForOID(oid)
	if !ok {
		return "", fmt.Errorf("unknown type oid %d", oid)
	}
	v, err := t.Codec.DecodeValue(m, oid, pgtype.BinaryFormatCode, raw)
	if err != nil {
		return "", err
	}
	out, err := m.Encode(oid, pgtype.TextFormatCode, v, nil)
	if err != nil {
		return "", err
	}
	return string(out), nil
}

// requestCapture is what one request sent, read from a window of events.
type requestCapture struct {
	Stmts []wireStmt
	// RoundTrips counts the client's bursts (it waits for an answer after each).
	RoundTrips int
	// PrepareRoundTrips are the bursts that only prepared statements (first
	// use of a statement on a connection); a warm server has none.
	PrepareRoundTrips int
	Errors            []string
}

// isPing reports whether a simple query is the driver's liveness check
// (pgx pings a connection idle for over a second with "-- ping").
// isWake reports whether sql is a NOTIFY sent outside any one start (the
// baseline's wake-up of its staged-job enqueuers, after a commit, on a
// connection of its own). It is not part of any one start's SQL, and may
// land in any request's capture window.
func isWake(sql string) bool {
	return strings.HasPrefix(strings.TrimSpace(sql), "SELECT pg_notify(")
}

func isPing(sql string) bool {
	s := strings.TrimSpace(sql)
	for strings.HasPrefix(s, "--") {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = strings.TrimSpace(s[i+1:])
		} else {
			s = ""
		}
	}
	return strings.Trim(s, "; \n\t") == ""
}

// summarize reads one request's statements and round trips from its events.
func summarize(events []wireEvent) requestCapture {
	type key struct{ conn, burst int }
	var rc requestCapture
	order := []key{}
	hasExec := map[key]bool{}
	hasParse := map[key]bool{}
	pingOnly := map[key]bool{}
	seen := map[key]bool{}
	for _, ev := range events {
		k := key{ev.Conn, ev.Burst}
		if ev.Type == '!' {
			rc.Errors = append(rc.Errors, ev.Err)
			continue
		}
		if !seen[k] {
			seen[k] = true
			pingOnly[k] = true
			order = append(order, k)
		}
		switch ev.Type {
		case 'Q', 'E':
			if ev.Type == 'Q' && isPing(ev.Stmt.SQL) || isWake(ev.Stmt.SQL) {
				continue
			}
			pingOnly[k] = false
			hasExec[k] = true
			s := *ev.Stmt
			s.Conn, s.Burst, s.Txn = ev.Conn, ev.Burst, ev.Txn
			rc.Stmts = append(rc.Stmts, s)
		case 'P':
			pingOnly[k] = false
			hasParse[k] = true
		case 'S', 'H', 'B', 'D', 'C':
			// part of a burst whose kind the statements decide; a lone
			// Sync after a ping stays a ping.
		default:
			pingOnly[k] = false
		}
	}
	for _, k := range order {
		switch {
		case pingOnly[k]:
		case hasExec[k]:
			rc.RoundTrips++
		case hasParse[k]:
			rc.RoundTrips++
			rc.PrepareRoundTrips++
		default:
			rc.RoundTrips++
		}
	}
	return rc
}
