package handlers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/valruns/valruns/internal/rfc3339"
	"github.com/valruns/valruns/models"
	"github.com/valruns/valruns/problem"
)

// decodeStrict decodes a JSON object body into v. Field names match exactly
// (encoding/json alone would let "SUBMISSION" fill Submission), and an
// unknown field is refused (a typo such as "submision" is an error, not a
// silently empty field). The problem names every field at fault in errors[],
// as the problem of any other bad field does.
func decodeStrict(body []byte, v any) *problem.Details {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequestPtr("The request body is empty; send a JSON object.")
	}
	if err := refuseNUL(body); err != nil {
		return badRequestPtr(err.Error())
	}
	if fields := fieldErrors(body, reflect.TypeOf(v), ""); len(fields) > 0 {
		var msgs []string
		for _, f := range fields {
			msgs = append(msgs, f.Field+": "+f.Message)
		}
		d := badRequest("The body has fields this route does not take: "+strings.Join(msgs, "; ")+".", fields...)
		return &d
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields() // unknownFields saw them all; a backstop
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			if typeErr.Field == "" {
				return badRequestPtr("The request body must be a JSON object.")
			}
			field := fieldPath(typeErr.Field)
			msg := "must be " + jsonKindOf(typeErr.Type)
			d := badRequest(fmt.Sprintf("%s %s.", field, msg), problem.FieldError{Field: field, Message: msg})
			return &d
		}
		return badRequestPtr("The request body is not what this route takes: " + err.Error())
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequestPtr("Unexpected data after the JSON object.")
	}
	return nil
}

func badRequestPtr(detail string) *problem.Details {
	d := badRequest(detail)
	return &d
}

// fieldErrors lists, sorted, the members of the JSON in raw that name no
// field of t exactly (by its json tag), and those whose value does not fit
// their field's type, looking into struct fields and slices of structs;
// path prefixes the names. JSON that does not fit t at all is left to the
// decoder to report.
func fieldErrors(raw []byte, t reflect.Type, path string) []problem.FieldError {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []problem.FieldError
	switch {
	case t == rawMessageType:
	case t.Kind() == reflect.Struct:
		var members map[string]json.RawMessage
		if json.Unmarshal(raw, &members) != nil {
			return nil
		}
		fields := jsonFields(t)
		for name, value := range members {
			p := path + "." + name
			if path == "" {
				p = name
			}
			ft, ok := fields[name]
			if !ok {
				msg := "unknown field"
				for known := range fields {
					if strings.EqualFold(known, name) {
						msg = fmt.Sprintf("unknown field; did you mean %q? (names are case-sensitive)", known)
					}
				}
				out = append(out, problem.FieldError{Field: p, Message: msg})
				continue
			}
			if nested := fieldErrors(value, ft, p); nested != nil {
				out = append(out, nested...)
				continue
			}
			if ft.Kind() != reflect.Struct && ft.Kind() != reflect.Slice && ft != rawMessageType &&
				json.Unmarshal(value, reflect.New(ft).Interface()) != nil {
				out = append(out, problem.FieldError{Field: p, Message: "must be " + jsonKindOf(ft)})
			}
		}
	case t.Kind() == reflect.Slice:
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			return nil
		}
		for i, item := range items {
			out = append(out, fieldErrors(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	slices.SortFunc(out, func(a, b problem.FieldError) int { return strings.Compare(a.Field, b.Field) })
	return out
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// jsonFields maps the JSON names of t's exported fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		fields[name] = f.Type
	}
	return fields
}

// fieldPath turns encoding/json's "assertions.0.name" into "assertions[0].name".
func fieldPath(field string) string {
	var b strings.Builder
	for i, part := range strings.Split(field, ".") {
		if _, err := strconv.Atoi(part); err == nil && i > 0 {
			b.WriteString("[" + part + "]")
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(part)
	}
	return b.String()
}

// jsonKindOf names the JSON a Go type takes.
func jsonKindOf(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "something else"
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
			return errors.New(`Strings must not contain the NUL character (\u0000).`)
		}
	}
}

// badRequest is the problem of a body that does not say what the route needs.
func badRequest(detail string, fields ...problem.FieldError) problem.Details {
	d := problem.New(http.StatusBadRequest, problem.ValidationError, detail)
	d.Errors = fields
	return d
}

func notFound(what string) problem.Details {
	return problem.New(http.StatusNotFound, problem.NotFound, what+" not found.")
}

// canonicalID parses an id from a path, a query or a cursor once, at the
// edge: every form uuid.Parse accepts (upper case, braces, no dashes,
// urn:uuid:) becomes the canonical lower-case dashed form that the stores
// and PostgreSQL get, so each form answers as the canonical one does. ok is
// false for anything else, which is a 404 (or a 400) without asking the
// database.
func canonicalID(id string) (canonical string, ok bool) {
	u, err := uuid.Parse(id)
	if err != nil {
		return "", false
	}
	return u.String(), true
}

// pageOf reads ?limit= and ?cursor=; a bad value answers 400 and returns false.
// So does a query string that is not valid percent-encoding (or has a ';'):
// Go's query parser drops such a pair and gin reads what is left, so
// `?cursor=%zz` would answer the first page and `?workflow_id=%zz` every
// workflow's runs, as if the parameter had not been sent.
func pageOf(c *gin.Context) (models.Page, bool) {
	var p models.Page
	if _, err := url.ParseQuery(c.Request.URL.RawQuery); err != nil {
		problem.Write(c, badRequest("The query string is not valid: "+err.Error()+"; percent-encode each name and value.",
			problem.FieldError{Field: "query", Message: "not valid percent-encoding"}))
		return p, false
	}
	if s := c.Query("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			problem.Write(c, badRequest("limit must be a whole number from 1 to 100.",
				problem.FieldError{Field: "limit", Message: "must be 1 to 100"}))
			return p, false
		}
		p.Limit = n
	}
	if s := c.Query("cursor"); s != "" {
		after, ok := positionOf(s)
		if !ok {
			problem.Abort(c, http.StatusBadRequest, problem.InvalidCursor, "The cursor is not one this API returned; start again without it.")
			return p, false
		}
		p.After = after
	}
	return p, true
}

// cursorOf is the next_cursor of a page whose next page starts at next
// ("" for none): opaque to clients, it is the position's time and id.
func cursorOf(next *models.Position) string {
	if next == nil {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(next.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + next.ID))
}

// positionOf reads a cursor (cursorOf) back, or reports that it is not one:
// a client may send anything, so each part is checked as any input from a
// client is, and the id is made canonical (canonicalID) before it goes on
// to the stores and PostgreSQL.
func positionOf(cursor string) (*models.Position, bool) {
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return nil, false
	}
	at, id, ok := strings.Cut(string(raw), "|")
	if !ok {
		return nil, false
	}
	t, err := rfc3339.Parse(at)
	if err != nil {
		return nil, false
	}
	if id, ok = canonicalID(id); !ok {
		return nil, false
	}
	return &models.Position{CreatedAt: t, ID: id}, true
}

// internalError answers a failure that is not the client's: 503
// service_unavailable while the database cannot be reached, 500 otherwise.
// Both can be retried as they are, and say so with Retry-After. An
// organisation gone (models.ErrOrgGone) is the client's: 401 (orgGone).
func internalError(c *gin.Context, err error) {
	if errors.Is(err, models.ErrOrgGone) {
		orgGone(c)
		return
	}
	if models.IsUnavailable(err) || errors.Is(context.Cause(c.Request.Context()), models.ErrStalled) {
		unavailable(c, err)
		return
	}
	_ = c.Error(err)
	c.Header("Retry-After", "1")
	problem.Abort(c, http.StatusInternalServerError, problem.InternalError, "An internal error occurred; retry the request.")
}

// unavailable answers 503 service_unavailable with Retry-After.
func unavailable(c *gin.Context, err error) {
	_ = c.Error(err)
	c.Header("Retry-After", "1")
	problem.Abort(c, http.StatusServiceUnavailable, problem.ServiceUnavailable, "The database is unavailable; retry shortly.")
}
