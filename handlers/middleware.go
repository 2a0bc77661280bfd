package handlers

import (
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/valruns/valruns/internal/telemetry"
	"github.com/valruns/valruns/problem"
)

// maxRequestIDLength bounds a client-chosen X-Request-Id.
const maxRequestIDLength = 128

// requestID takes the client's X-Request-Id when it is sane, makes one
// otherwise, and echoes it on the response. The request's context carries
// it, so that every line logged for the request names it.
func requestID() gin.HandlerFunc {
	return func(c *gin.Context) {
		id := c.GetHeader("X-Request-Id")
		if !saneRequestID(id) {
			var b [12]byte
			_, _ = rand.Read(b[:])
			id = hex.EncodeToString(b[:])
		}
		c.Set(problem.RequestIDKey, id)
		c.Header("X-Request-Id", id)
		c.Request = c.Request.WithContext(telemetry.WithRequestID(c.Request.Context(), id))
		c.Next()
	}
}

func saneRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// recovery answers a panic with a 500 problem and logs the stack; the
// client never sees it.
func recovery(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			if p := recover(); p != nil {
				log.ErrorContext(c.Request.Context(), "panic", "panic", fmt.Sprint(p),
					"request_id", c.GetString(problem.RequestIDKey), "stack", string(debug.Stack()))
				if !c.Writer.Written() {
					problem.Abort(c, http.StatusInternalServerError, problem.InternalError, "An internal error occurred.")
				}
			}
		}()
		c.Next()
	}
}

// logRequests writes one structured line per request.
func logRequests(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		level := slog.LevelInfo
		if c.Writer.Status() >= 500 {
			level = slog.LevelError
		}
		log.Log(c.Request.Context(), level, "request",
			"method", c.Request.Method, "path", c.Request.URL.Path, "status", c.Writer.Status(),
			"duration_ms", float64(time.Since(start).Microseconds())/1000,
			"request_id", c.GetString(problem.RequestIDKey), "client_ip", c.ClientIP(),
			"replayed", c.Writer.Header().Get("Idempotent-Replayed") == "true")
	}
}

// limitBody caps request bodies at n bytes: reading past them fails, and
// whoever reads the body answers 413. A route that does not read its body
// (a GET) never pays for it. The idempotent routes answer the 413
// themselves, so that it is counted among their outcomes; the reader stops
// at n+1 bytes however large the declared or sent body.
//
// With Expect: 100-continue, a declared Content-Length over n fails the
// first read without touching the connection, so the client gets the 413
// without being invited to send the body. A gzip body (Content-Encoding:
// gzip) is decoded, and the limit counts the decoded bytes; a body in any
// other encoding is 415 at once, naming the one encoding accepted.
func limitBody(n int64) gin.HandlerFunc {
	return func(c *gin.Context) {
		r := c.Request
		enc := strings.ToLower(strings.TrimSpace(strings.Join(r.Header.Values("Content-Encoding"), ",")))
		hasBody := r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
		switch {
		case !hasBody || enc == "" || enc == "identity":
			enc = ""
		case enc == "gzip" || enc == "x-gzip":
		default:
			c.Header("Accept-Encoding", "gzip")
			problem.Abort(c, http.StatusUnsupportedMediaType, problem.UnsupportedContentEncoding,
				fmt.Sprintf("Content-Encoding %q is not accepted: send the body as is, or gzip-encoded.", bounded(enc, 64)))
			return
		}
		if n > 0 {
			switch {
			case enc == "" && r.ContentLength > n && strings.EqualFold(r.Header.Get("Expect"), "100-continue"):
				// Only for a client that waits to be invited: one that is
				// already sending would meet a closed connection before it
				// reads the 413 (it gets it after the limit is read instead).
				r.Body = tooLarge{n}
				// The body stays on the wire unread: the connection ends
				// with the answer (net/http would otherwise read the body,
				// inviting it with 100 Continue, to reuse the connection).
				c.Header("Connection", "close")
			case enc != "":
				r.Body = http.MaxBytesReader(c.Writer, &gunzip{raw: r.Body}, n)
			default:
				r.Body = http.MaxBytesReader(c.Writer, r.Body, n)
			}
		} else if enc != "" {
			r.Body = &gunzip{raw: r.Body}
		}
		if enc != "" {
			r.Header.Del("Content-Encoding")
			r.ContentLength = -1
		}
		c.Next()
		// An answer given before the body was read (a 401, a 503 from
		// authentication, any 4xx before the handler reads) is still in
		// the server's buffer here: what is left of the body is read and
		// dropped before it goes out (discardBody). A client waiting for
		// 100 Continue is not invited now: net/http closes its connection.
		if !strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
			discardBody(c)
		}
	}
}

// bounded is s cut to at most n bytes, for a detail that quotes a client.
func bounded(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// tooLarge is the body of a request whose Content-Length is over the limit:
// it fails as http.MaxBytesReader would, without reading the connection.
type tooLarge struct{ limit int64 }

func (b tooLarge) Read([]byte) (int, error) { return 0, &http.MaxBytesError{Limit: b.limit} }
func (b tooLarge) Close() error             { return nil }

// gunzip decodes a gzip body as it is read; the gzip header is read on the
// first Read, so a handler that does not read its body never decodes it.
type gunzip struct {
	raw io.ReadCloser
	zr  *gzip.Reader
	err error
}

func (g *gunzip) Read(p []byte) (int, error) {
	if g.zr == nil && g.err == nil {
		g.zr, g.err = gzip.NewReader(g.raw)
		if g.err != nil {
			g.err = fmt.Errorf("%w: %v", errNotGzip, g.err)
		}
	}
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.zr.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%w: %v", errNotGzip, err)
	}
	return n, err
}

func (g *gunzip) Close() error { return g.raw.Close() }

// errNotGzip is the error of a body labelled gzip that is not.
var errNotGzip = errors.New("the body is labelled Content-Encoding: gzip but is not valid gzip")
