// Package problem writes RFC 9457 problem documents
// (Content-Type: application/problem+json). It is the one way every layer of
// valruns answers an error, so clients can rely on type, title, status,
// detail and a stable machine-readable code, and never see a stack trace or SQL.
package problem

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	"github.com/gin-gonic/gin"
)

// ContentType is the media type of a problem document.
const ContentType = "application/problem+json"

// TypeBase prefixes the code to form the problem's type: a path, resolved
// against the address that answered (RFC 9457 3.1.1), where the service
// serves the code's page. A relative type needs no setting, names one kind
// of problem on every deployment (a client may compare types), and stays
// true in an answer stored for an idempotent replay whatever address later
// replays it.
const TypeBase = "/problems/"

// Details is an RFC 9457 problem document.
type Details struct {
	// Type is a URI reference naming the kind of problem: /problems/ and
	// the code, the path of the code's page on the service.
	Type string `json:"type" validate:"required" example:"/problems/idempotency_key_reused"`
	// Title is a short summary of the kind of problem.
	Title string `json:"title" validate:"required" example:"Unprocessable Entity"`
	// Status repeats the HTTP status code.
	Status int `json:"status" validate:"required" example:"422"`
	// Detail explains this occurrence.
	Detail string `json:"detail" validate:"required" example:"Idempotency key has already been used with a different request body."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" validate:"required" example:"idempotency_key_reused"`
	// Instance is the path of the request as the client sent it, trailing
	// slash and percent-escapes included, without the query (always present
	// in an answer).
	Instance string `json:"instance,omitempty" validate:"required" example:"/api/workflows/7c0e.../start/"`
	// RequestID is the X-Request-Id of the request, for support (always
	// present in an answer; on a replay, the first request's).
	RequestID string `json:"request_id,omitempty" validate:"required" example:"4f1c2b9e8a7d6c5b"`
	// Errors lists per-field problems of a 400, when there are several.
	Errors []FieldError `json:"errors,omitempty"`
}

// FieldError names one invalid field of a request.
type FieldError struct {
	// Field is the JSON path of the field, such as assertions[1].expr.
	Field string `json:"field" validate:"required" example:"assertions[0].expr"`
	// Message says what is wrong with it.
	Message string `json:"message" validate:"required" example:"undeclared reference to 'x'"`
}

// New builds a problem document for status with a stable code and a detail.
func New(status int, code Code, detail string) Details {
	return Details{
		Type:   TypeBase + code.name,
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
		Code:   code.name,
	}
}

// Body renders d as JSON bytes (used where the answer is stored, such as an
// idempotent response).
func (d Details) Body() []byte {
	b, err := json.Marshal(d)
	if err != nil { // cannot happen: only strings and ints
		panic(err)
	}
	return b
}

// RequestIDKey is the gin context key under which the request id middleware
// stores the request's id.
const RequestIDKey = "request_id"

// Write answers the request with d, aborting the gin chain.
func Write(c *gin.Context, d Details) {
	if d.Instance == "" {
		d.Instance = Path(c.Request)
	}
	if d.RequestID == "" {
		d.RequestID = c.GetString(RequestIDKey)
	}
	c.Header("Content-Type", ContentType)
	c.Writer.WriteHeader(d.Status)
	_, _ = c.Writer.Write(d.Body())
	c.Abort()
}

// Path is the path of r as its client sent it: the request line's target
// without its query, escapes and trailing slash kept. It is a problem's
// instance. r.URL.Path is not: the router serves /a/b/ as /a/b by rewriting
// it (handlers.StripTrailingSlash), and it is unescaped. r.RequestURI, which
// nothing rewrites, is read instead; a request without one (made by a
// client, not received) has only its URL.
func Path(r *http.Request) string {
	if strings.HasPrefix(r.RequestURI, "/") {
		path, _, _ := strings.Cut(r.RequestURI, "?")
		return path
	}
	if u, err := url.ParseRequestURI(r.RequestURI); err == nil && u.Path != "" {
		return u.EscapedPath() // the absolute form: http://host/path
	}
	return r.URL.EscapedPath()
}

// Abort is Write(c, New(status, code, detail)).
func Abort(c *gin.Context, status int, code Code, detail string) {
	Write(c, New(status, code, detail))
}
