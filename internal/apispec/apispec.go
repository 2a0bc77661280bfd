// Package apispec adds to the OpenAPI (Swagger 2.0) spec that swag generates
// what swag cannot write: an example of every documented response, and
// examples of the requests. The examples are not written by hand: the
// handlers' test TestAPIExamples sends each documented situation to the
// real router on a real database and records the answers (ids, times and
// request ids made stable) in examples.json, and fails when they no longer
// are what the API answers. `make docs` runs swag, then Apply (cmd apply)
// merges examples.json into docs/, so docs/ stays generated and `make
// docs-check` reproduces it byte for byte.
//
// Swagger 2.0 has one place for a response example: the response's
// `examples`, keyed by media type. Swagger UI shows the example of the media
// type selected for the operation, application/json unless the reader picks
// another; so a problem document (application/problem+json) is listed
// under both types, or the UI would show a sample made up from the schema.
package apispec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"os"
	"sort"
	"strings"
)

// DefaultFile is examples.json, relative to the module root.
const DefaultFile = "internal/apispec/examples.json"

// File is the content of examples.json.
type File struct {
	// Operations by "METHOD path", the path as the spec writes it
	// ("POST /api/workflows/{id}/start/").
	Operations map[string]*Operation `json:"operations"`
}

// Operation is what was recorded of one operation.
type Operation struct {
	// Request is the request of the operation's success example.
	Request *Request `json:"request,omitempty"`
	// Responses by status code.
	Responses map[string]*Response `json:"responses"`
}

// Request is an example request.
type Request struct {
	// Headers are header parameters, by name: each becomes its
	// parameter's x-example (what Swagger UI fills in).
	Headers map[string]string `json:"headers,omitempty"`
	// Body becomes the example of the body parameter's schema.
	Body json.RawMessage `json:"body,omitempty"`
}

// Response is the example of one status of an operation, and the other
// situations recorded with the same status.
type Response struct {
	// Situation says what was sent to get this answer.
	Situation string `json:"situation"`
	// ContentType is the answer's Content-Type.
	ContentType string `json:"content_type"`
	// Headers are the answer's headers, but Content-Type.
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the answer's body: JSON, or a JSON string for a text answer.
	Body json.RawMessage `json:"body"`
	// Also are the other situations recorded with this status.
	Also []Variant `json:"also,omitempty"`
}

// Variant is another situation answered with the same status.
type Variant struct {
	Situation string `json:"situation"`
	// Code is the problem document's code ("" for other answers).
	Code string `json:"code,omitempty"`
	// Headers are the names of the answer's headers, but Content-Type.
	Headers []string `json:"headers,omitempty"`
}

// Code is the code of the example's problem document ("" for other answers).
func (r *Response) Code() string {
	var p struct{ Code string }
	_ = json.Unmarshal(r.Body, &p)
	return p.Code
}

// Codes are the problem codes recorded with this status, the example's first.
func (r *Response) Codes() []string {
	var out []string
	add := func(c string) {
		for _, have := range out {
			if have == c {
				return
			}
		}
		if c != "" {
			out = append(out, c)
		}
	}
	add(r.Code())
	for _, v := range r.Also {
		add(v.Code)
	}
	return out
}

// HeaderNames are the names of every header recorded with this status.
func (r *Response) HeaderNames() []string {
	seen := map[string]bool{}
	for name := range r.Headers {
		seen[name] = true
	}
	for _, v := range r.Also {
		for _, name := range v.Headers {
			seen[name] = true
		}
	}
	out := make([]string, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// MediaTypes are the keys the example is listed under in the spec of an
// operation that produces the media types produces; none for an answer
// without a body (204). A problem document is listed under
// application/json too when the operation produces JSON: its readers look
// for its errors there (a problem page's operation produces text, and has
// its problem under application/problem+json alone).
func (r *Response) MediaTypes(produces map[string]bool) ([]string, error) {
	if r.ContentType == "" {
		return nil, nil
	}
	mt, _, err := mime.ParseMediaType(r.ContentType)
	if err != nil {
		return nil, fmt.Errorf("content type %q: %w", r.ContentType, err)
	}
	if mt == "application/problem+json" && produces["application/json"] {
		return []string{"application/json", mt}, nil
	}
	return []string{mt}, nil
}

// Load reads examples.json.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f File
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &f, nil
}

// Marshal is f as examples.json writes it: indented, keys sorted, strings
// as they are (no HTML escapes), a newline at the end.
func (f *File) Marshal() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(f); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Apply adds f's examples to spec, a Swagger 2.0 document: each response's
// examples (and a line of its description saying what it answered), the
// header parameters' x-example and the body parameter's example. Every
// operation and status of f must be documented in spec, and none may have
// examples yet: Apply runs once, on swag's output.
func Apply(spec *Value, f *File) error {
	paths := spec.Get("paths")
	keys := make([]string, 0, len(f.Operations))
	for k := range f.Operations {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		method, path, ok := strings.Cut(k, " ")
		if !ok {
			return fmt.Errorf("operation %q: want METHOD /path", k)
		}
		op := paths.Get(path).Get(strings.ToLower(method))
		if op == nil {
			return fmt.Errorf("operation %s is not in the spec", k)
		}
		if err := applyOperation(spec, op, f.Operations[k]); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

// applyOperation adds one operation's examples to op, its object in spec:
// each recorded response's, then the request's.
func applyOperation(spec, op *Value, o *Operation) error {
	produces := operationProduces(op)
	responses := op.Get("responses")
	statuses := make([]string, 0, len(o.Responses))
	for s := range o.Responses {
		statuses = append(statuses, s)
	}
	sort.Strings(statuses)
	for _, status := range statuses {
		resp := responses.Get(status)
		if resp == nil {
			return fmt.Errorf("status %s is not documented", status)
		}
		if resp.Get("examples") != nil {
			return fmt.Errorf("status %s has examples already (Apply runs on swag's output)", status)
		}
		if err := applyResponse(resp, o.Responses[status], produces); err != nil {
			return fmt.Errorf("status %s: %w", status, err)
		}
	}
	if o.Request == nil {
		return nil
	}
	return applyRequest(spec, op, o.Request)
}

// operationProduces is the set of media types op says it produces.
func operationProduces(op *Value) map[string]bool {
	produces := map[string]bool{}
	if p := op.Get("produces"); p != nil {
		for _, item := range p.Array {
			produces[item.Str()] = true
		}
	}
	return produces
}

// applyResponse sets resp's examples, one per media type of r, and adds to
// its description what the example answered.
func applyResponse(resp *Value, r *Response, produces map[string]bool) error {
	types, err := r.MediaTypes(produces)
	if err != nil {
		return err
	}
	examples := &Value{Kind: '{', Object: []Member{}}
	for _, mt := range types {
		v, err := responseExample(r, mt, produces)
		if err != nil {
			return err
		}
		examples.Set(mt, v)
	}
	if len(types) > 0 {
		resp.Set("examples", examples)
	}
	if r.Situation != "" {
		desc := resp.Get("description").Str()
		resp.Set("description", String(desc+ExampleSeparator+r.Situation+"."))
	}
	return nil
}

// responseExample is r's body as the example of media type mt.
func responseExample(r *Response, mt string, produces map[string]bool) (*Value, error) {
	if !produces[mt] {
		return nil, fmt.Errorf("%s is not one of the operation's produces", mt)
	}
	body := r.Body
	if !strings.HasSuffix(mt, "json") {
		// A text answer is recorded as a JSON string; the spec's
		// example of it is that string.
		var s string
		if err := json.Unmarshal(body, &s); err != nil {
			return nil, fmt.Errorf("a %s example must be a JSON string: %w", mt, err)
		}
	}
	v, err := Decode(body, true)
	if err != nil {
		return nil, fmt.Errorf("example: %w", err)
	}
	return v, nil
}

// applyRequest sets the x-example of op's header parameters and the example
// of its body's schema, a definition of spec.
func applyRequest(spec, op *Value, req *Request) error {
	if _, ok := req.Headers["Idempotency-Key"]; ok {
		// Swagger UI would fill it in for every visitor: they would share
		// one key, and all but the first get 422s.
		return fmt.Errorf("request header Idempotency-Key: the spec must not give a fixed key as an example")
	}
	params := op.Get("parameters")
	names := make([]string, 0, len(req.Headers))
	for name := range req.Headers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := param(params, "header", name)
		if p == nil {
			return fmt.Errorf("request header %s is not a parameter", name)
		}
		p.Set("x-example", String(req.Headers[name]))
	}
	if req.Body == nil {
		return nil
	}
	p := param(params, "body", "")
	if p == nil {
		return fmt.Errorf("request body: the operation has no body parameter")
	}
	ref := p.Get("schema").Get("$ref").Str()
	name, ok := strings.CutPrefix(ref, "#/definitions/")
	def := spec.Get("definitions").Get(name)
	if !ok || def == nil {
		return fmt.Errorf("request body: schema %q is not a definition", ref)
	}
	v, err := Decode(req.Body, true)
	if err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	def.Set("example", v)
	return nil
}

// ExampleSeparator ends a response's description written in the
// annotations; what follows says what the example answered.
const ExampleSeparator = "\n\nExample: "

func param(params *Value, in, name string) *Value {
	if params == nil {
		return nil
	}
	for _, p := range params.Array {
		if p.Get("in").Str() == in && (name == "" || p.Get("name").Str() == name) {
			return p
		}
	}
	return nil
}
