package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// decodeStrict decodes a JSON object body into v, refusing unknown fields
// (a typo such as "submision" is an error, not a silently empty field).
func decodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return errors.New("the request body is empty; send a JSON object")
	}
	if err := refuseNUL(body); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			if typeErr.Field == "" {
				return errors.New("the request body must be a JSON object")
			}
			return fmt.Errorf("field %q must be %s", typeErr.Field, typeErr.Type.Kind())
		}
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

// refuseNUL refuses a body with U+0000 in any string or key: PostgreSQL text
// and jsonb cannot store it, so the insert would fail as a 500 on every retry.
func refuseNUL(body []byte) error {
	if !bytes.Contains(body, []byte(`\u0000`)) {
		return nil // a raw NUL is not valid JSON; only the escape can make one
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // io.EOF, or a syntax error that Decode reports
		}
		if s, ok := tok.(string); ok && strings.IndexByte(s, 0) >= 0 {
			return errors.New(`strings must not contain the NUL character (\u0000)`)
		}
	}
}

// badRequest is the problem of a body that does not say what the route needs.
func badRequest(detail string, fields ...problem.FieldError) problem.Details {
	d := problem.New(http.StatusBadRequest, "validation_error", detail)
	d.Errors = fields
	return d
}

func notFound(what string) problem.Details {
	return problem.New(http.StatusNotFound, "not_found", what+" not found.")
}

// validID reports whether id can be a row id; anything else is a 404 without
// asking the database.
func validID(id string) bool { return uuid.Validate(id) == nil }

// pageOf reads ?limit= and ?cursor=; a bad value answers 400 and returns false.
func pageOf(c *gin.Context) (models.Page, bool) {
	var p models.Page
	if s := c.Query("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			problem.Write(c, badRequest("limit must be a whole number from 1 to 100.",
				problem.FieldError{Field: "limit", Message: "must be 1 to 100"}))
			return p, false
		}
		p.Limit = n
	}
	p.Cursor = c.Query("cursor")
	return p, true
}

// listFailed answers an error of a List store call.
func listFailed(c *gin.Context, err error) {
	if errors.Is(err, models.ErrBadCursor) {
		problem.Abort(c, http.StatusBadRequest, "invalid_cursor", "The cursor is not one this API returned; start again without it.")
		return
	}
	internalError(c, err)
}

func internalError(c *gin.Context, err error) {
	_ = c.Error(err)
	problem.Abort(c, http.StatusInternalServerError, "internal_error", "An internal error occurred.")
}
