package apispec

import (
	"fmt"
	"slices"
	"strings"
)

// CommonPrefix starts the description of a response that an annotation
// leaves to Common: `@Failure 401 {object} ProblemUnauthorized
// "common:unauthorized"`.
const CommonPrefix = "common:"

// CommonResponse is a response that many operations answer alike.
type CommonResponse struct {
	// Status is the status it is answered with.
	Status string
	// Schema is the definition of its body.
	Schema string
	// Description says what it means and what to do.
	Description string
	// Headers are the headers it carries (besides RequestIDHeader, which
	// every answer carries).
	Headers []CommonHeader
}

// CommonHeader is a header of a common response.
type CommonHeader struct {
	Name, Type, Description string
}

var retryAfter = CommonHeader{"Retry-After", "integer", "Seconds to wait before retrying."}

// Common are the responses many operations answer alike, by the name an
// annotation gives them (CommonPrefix): each is written here once, and
// ExpandCommon copies it into every operation that names it, so that each
// operation still shows it in full and carries its own recorded example.
var Common = map[string]CommonResponse{
	"unauthorized": {
		Status: "401", Schema: "handlers.ProblemUnauthorized",
		Description: "No usable API token: `unauthenticated` (no `Authorization: Bearer` header, or more than one credential) or `invalid_token` (unknown or revoked, or its organisation deleted).",
		Headers: []CommonHeader{{"WWW-Authenticate", "string",
			`Bearer realm="valruns" (with error="invalid_token" for an unknown or revoked token, error="invalid_request" for more than one credential).`}},
	},
	// A read, or a write without an Idempotency-Key.
	"internal": {
		Status: "500", Schema: "handlers.ProblemInternal",
		Description: "`internal_error`: a query failed; retry.",
		Headers:     []CommonHeader{retryAfter},
	},
	"unavailable": {
		Status: "503", Schema: "handlers.ProblemUnavailable",
		Description: "`service_unavailable`: the database cannot be reached (or the token could not be checked); retry after `Retry-After` seconds. " +
			"Or `overloaded`: this API process serves as many requests or request bodies as it may (MAX_REQUESTS_IN_FLIGHT, MAX_BODY_BYTES_IN_FLIGHT); nothing was done: retry after `Retry-After` seconds.",
		Headers: []CommonHeader{retryAfter},
	},
	// An operation that takes an Idempotency-Key (a write in a request transaction).
	"unavailable_keyed": {
		Status: "503", Schema: "handlers.ProblemUnavailable",
		Description: "`service_unavailable` (the database cannot be reached), `request_timeout` (the request's transaction ran past IDEMPOTENCY_TX_TIMEOUT and was rolled back) " +
			"or `overloaded` (this API process serves as many requests or request bodies as it may: MAX_REQUESTS_IN_FLIGHT, MAX_BODY_BYTES_IN_FLIGHT); " +
			"nothing was done, unless the detail says the outcome is unknown (the database stopped answering after the write was sent: it may have been done). " +
			"Either way, retry after `Retry-After` seconds with the same key: it replays what was done, or does it.",
		Headers: []CommonHeader{retryAfter},
	},
}

// RequestIDHeader is carried by every answer of every operation: the
// router's first middleware sets it.
var RequestIDHeader = CommonHeader{"X-Request-Id", "string",
	"The request's id: the client's X-Request-Id when it is 1-128 printable ASCII characters, a new one otherwise."}

// ExpandCommon gives every response of every operation RequestIDHeader,
// and replaces every response of spec (a Swagger 2.0 document as
// swag generated it) whose description is CommonPrefix + a name of Common
// with that common response: its description, and its headers, but those
// the operation gives the response itself (its own say more). The status
// and the schema written in the annotation must be the common response's.
func ExpandCommon(spec *Value) error {
	for _, p := range spec.Get("paths").objectMembers() {
		for _, m := range p.Value.objectMembers() {
			for _, r := range m.Value.Get("responses").objectMembers() {
				addHeader(r.Value, RequestIDHeader)
				name, ok := strings.CutPrefix(r.Value.Get("description").Str(), CommonPrefix)
				if !ok {
					continue
				}
				where := fmt.Sprintf("%s %s %s", strings.ToUpper(m.Key), p.Key, r.Key)
				c, ok := Common[name]
				switch {
				case !ok:
					return fmt.Errorf("%s: no common response %q", where, name)
				case c.Status != r.Key:
					return fmt.Errorf("%s: common response %q is a %s", where, name, c.Status)
				case r.Value.Get("schema").Get("$ref").Str() != "#/definitions/"+c.Schema:
					return fmt.Errorf("%s: common response %q has the schema %s", where, name, c.Schema)
				}
				r.Value.Set("description", String(c.Description))
				for _, h := range c.Headers {
					addHeader(r.Value, h)
				}
			}
		}
	}
	return nil
}

// addHeader adds h to the headers of response r, in the order of their
// names as swag writes them, unless r has a header of that name already.
func addHeader(r *Value, h CommonHeader) {
	headers := r.Get("headers")
	if headers == nil {
		headers = &Value{Kind: '{', Object: []Member{}}
		r.Set("headers", headers)
	}
	if headers.Get(h.Name) != nil {
		return
	}
	v := &Value{Kind: '{', Object: []Member{{"type", String(h.Type)}, {"description", String(h.Description)}}}
	i, _ := slices.BinarySearchFunc(headers.Object, h.Name, func(m Member, name string) int { return strings.Compare(m.Key, name) })
	headers.Object = slices.Insert(headers.Object, i, Member{Key: h.Name, Value: v})
}

func (v *Value) objectMembers() []Member {
	if v == nil {
		return nil
	}
	return v.Object
}
