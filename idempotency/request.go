package idempotency

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/valruns/valruns/internal/canonjson"
	"github.com/valruns/valruns/problem"
)

// Request is what a wrapped handler gets besides the transaction.
type Request struct {
	// Gin is the request's context, for path parameters and values set by
	// middleware. The handler must not write to it: it returns its answer.
	Gin *gin.Context
	// Body is the raw request body: a JSON object (or empty when the
	// wrapper allows it), each of whose numbers has a bounded canonical
	// form (canonjson.MaxNumberLength).
	Body []byte
	// Key is the request's Idempotency-Key ("" without one). A handler
	// stores it on what it creates, to link the two.
	Key string
	// RequestID is the request's X-Request-Id.
	RequestID string
}

// readKey reads the Idempotency-Key header; false when it answered 400.
func (k *call[T]) readKey() bool {
	raw, present := k.c.Request.Header[HeaderKey]
	switch {
	case present:
		key, err := ParseKey(raw[0])
		switch {
		case len(raw) > 1:
			k.reject(http.StatusBadRequest, problem.IdempotencyKeyInvalid, "Send exactly one Idempotency-Key header.")
			return false
		case errors.Is(err, ErrKeyTooLong):
			k.reject(http.StatusBadRequest, problem.IdempotencyKeyTooLong, "Idempotency key exceeds maximum length of 255 characters.")
			return false
		case err != nil:
			k.reject(http.StatusBadRequest, problem.IdempotencyKeyInvalid,
				"Idempotency key must be 1 to 255 printable ASCII characters, bare (abc) or as a quoted string (\"abc\").")
			return false
		}
		k.key = key
	case k.w.cfg.KeyRequired:
		k.reject(http.StatusBadRequest, problem.IdempotencyKeyMissing, "This endpoint requires an Idempotency-Key header.")
		return false
	}
	return true
}

// readBody reads and canonicalises the body and computes the request's
// fingerprint; false when it answered (4xx, nothing stored): a body that is
// too large, not JSON, empty, not an object, or holding a number the
// database cannot store as sent.
func (k *call[T]) readBody() bool {
	body, err := io.ReadAll(k.c.Request.Body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			k.reject(http.StatusRequestEntityTooLarge, problem.RequestBodyTooLarge,
				fmt.Sprintf("The request body exceeds the limit of %d bytes.", tooBig.Limit))
			return false
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The client sent its body slower than the server's read
			// timeout: nothing was wrong with the request, and it may be
			// sent again (408, RFC 9110 15.5.9). The connection is done.
			k.c.Header("Connection", "close")
			k.reject(http.StatusRequestTimeout, problem.RequestBodyTimeout,
				"The request body did not arrive in time; nothing was done. Send the request again.")
			return false
		}
		k.reject(http.StatusBadRequest, problem.InvalidJSON, "The request body could not be read: "+err.Error()+".")
		return false
	}
	canonical, err := canonjson.CanonicalizeBounded(body, k.w.cfg.MaxBodyBytes)
	var numErr *canonjson.NumberError
	var sizeErr *canonjson.SizeError
	switch {
	case errors.As(err, &numErr):
		d := problem.New(http.StatusBadRequest, problem.InvalidNumber, "The number at "+numErr.Path+" cannot be stored as sent: "+
			fmt.Sprintf("written out in decimal it has %d digits, and at most %d are accepted.", numErr.Length, canonjson.MaxNumberLength))
		d.Errors = []problem.FieldError{{Field: numErr.Path, Message: fmt.Sprintf("number longer than %d digits in decimal", canonjson.MaxNumberLength)}}
		k.outcome = OutcomeRejected
		problem.Write(k.c, d)
		return false
	case errors.As(err, &sizeErr):
		k.reject(http.StatusRequestEntityTooLarge, problem.RequestBodyTooLarge, fmt.Sprintf(
			"With its numbers written out in decimal, as they are stored, the request body is %d bytes, over the limit of %d.",
			sizeErr.Size, sizeErr.Limit))
		return false
	case err != nil:
		k.reject(http.StatusBadRequest, problem.InvalidJSON, "The request body is not valid JSON: "+err.Error())
		return false
	case canonical == nil && !k.w.cfg.AllowEmptyBody && !k.noBody:
		k.reject(http.StatusBadRequest, problem.InvalidJSON, "The request body is empty; send a JSON object.")
		return false
	case canonical != nil && canonical[0] != '{':
		k.reject(http.StatusBadRequest, problem.InvalidJSON, "The request body must be a JSON object.")
		return false
	}
	k.body = body
	k.canonical = canonical
	k.hash = Fingerprint(k.c.Request.Method, routePath(k.c), canonical)
	return true
}

// routePath is the path a fingerprint covers: the route with its
// parameters, a UUID in its canonical lower-case form, so that the same
// request reaches the same fingerprint however a client spells the id.
func routePath(c *gin.Context) string {
	route := c.FullPath()
	if route == "" {
		return c.Request.URL.Path
	}
	parts := strings.Split(route, "/")
	for i, part := range parts {
		if name, ok := strings.CutPrefix(part, ":"); ok {
			v := c.Param(name)
			if id, err := uuid.Parse(v); err == nil {
				v = id.String()
			}
			parts[i] = v
		}
	}
	return strings.Join(parts, "/")
}

// request is what the route's functions get of the request.
func (k *call[T]) request() Request {
	return Request{Gin: k.c, Body: k.body, RequestID: k.requestID, Key: k.key}
}
