package handlers

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/valruns/valruns/problem"
)

// maxRequestIDLength bounds a client-chosen X-Request-Id.
const maxRequestIDLength = 128

// requestID takes the client's X-Request-Id when it is sane, makes one
// otherwise, and echoes it on the response.
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
					problem.Abort(c, http.StatusInternalServerError, "internal_error", "An internal error occurred.")
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
func limitBody(n int64) gin.HandlerFunc {
	return func(c *gin.Context) {
		if n > 0 {
			c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, n)
		}
		c.Next()
	}
}
