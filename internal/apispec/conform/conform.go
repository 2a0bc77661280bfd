// Package conform checks answers of the API against its OpenAPI 3 document
// (docs/openapi.json, which make docs converts from swag's spec) with
// kin-openapi's openapi3filter: the status is one the operation documents,
// the body fits that response's schema for its Content-Type, each
// documented header that is present fits its schema, and every header the
// answer carries is documented. The handlers' tests run every answer of
// their API through it (internal/apitest), so a server and a spec that
// disagree fail make test.
package conform

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/valruns/valruns/docs"
)

// The problem pages (/problems/) are text, HTML or Markdown, as /metrics
// is text/plain: their bodies are checked as strings.
func init() {
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
	openapi3filter.RegisterBodyDecoder("text/markdown", openapi3filter.PlainBodyDecoder)
}

// Checker checks answers against one OpenAPI 3 document.
type Checker struct {
	doc    *openapi3.T
	routes []route
}

type route struct {
	path   string // as the document writes it
	re     *regexp.Regexp
	params []string
	item   *openapi3.PathItem
}

var pathParam = regexp.MustCompile(`\{([^}/]+)\}`)

// New reads an OpenAPI 3 document (JSON or YAML).
func New(doc []byte) (*Checker, error) {
	loader := openapi3.NewLoader()
	t, err := loader.LoadFromData(doc)
	if err != nil {
		return nil, fmt.Errorf("conform: load the document: %w", err)
	}
	if err := t.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("conform: the document is not valid: %w", err)
	}
	if err := t.WalkSchemas(anyValueTakesNull); err != nil {
		return nil, err
	}
	c := &Checker{doc: t}
	for path, item := range t.Paths.Map() {
		r := route{path: path, item: item}
		r.re, r.params = templateExpr(path)
		c.routes = append(c.routes, r)
	}
	// The most specific first: fewer parameters win.
	sort.Slice(c.routes, func(i, j int) bool {
		if len(c.routes[i].params) != len(c.routes[j].params) {
			return len(c.routes[i].params) < len(c.routes[j].params)
		}
		return c.routes[i].path < c.routes[j].path
	})
	return c, nil
}

// anyValueTakesNull makes a schema that constrains nothing take null too,
// as OpenAPI 3.0.3 reads it: a schema without type takes every value, and
// nullable only adds null to a type written beside it. kin-openapi refuses
// null there unless nullable is set, and the document cannot set it: nullable
// without a type is invalid OpenAPI 3.0 (the linters' error). So a member
// of any JSON value (a run's submission) is an empty schema in the document,
// and nullable here.
func anyValueTakesNull(_ string, ref *openapi3.SchemaRef) error {
	s := ref.Value
	if (s.Type == nil || len(*s.Type) == 0) && s.Not == nil && len(s.AnyOf)+len(s.OneOf)+len(s.AllOf)+len(s.Enum) == 0 && s.Const == nil {
		s.Nullable = true
	}
	return nil
}

// templateExpr matches the paths of the template path: a parameter is one
// segment, and the trailing slash is optional (the router serves both).
func templateExpr(path string) (*regexp.Regexp, []string) {
	var expr strings.Builder
	var params []string
	rest := strings.TrimSuffix(path, "/")
	for {
		loc := pathParam.FindStringSubmatchIndex(rest)
		if loc == nil {
			break
		}
		expr.WriteString(regexp.QuoteMeta(rest[:loc[0]]))
		expr.WriteString("([^/]+)")
		params = append(params, rest[loc[2]:loc[3]])
		rest = rest[loc[1]:]
	}
	expr.WriteString(regexp.QuoteMeta(rest))
	return regexp.MustCompile("^" + expr.String() + "/?$"), params
}

// Spec is the checker of docs/openapi.json, read once.
var Spec = sync.OnceValues(func() (*Checker, error) { return New(docs.OpenAPI3JSON) })

// Documented reports whether the document has an operation for method and
// path (with or without the trailing slash).
func (c *Checker) Documented(method, path string) bool {
	_, op, _ := c.find(method, path)
	return op != nil
}

func (c *Checker) find(method, rawPath string) (*route, *openapi3.Operation, map[string]string) {
	for i := range c.routes {
		r := &c.routes[i]
		m := r.re.FindStringSubmatch(rawPath)
		if m == nil {
			continue
		}
		op := r.item.GetOperation(method)
		if op == nil {
			return r, nil, nil
		}
		params := map[string]string{}
		for j, name := range r.params {
			v, err := url.PathUnescape(m[j+1])
			if err != nil {
				v = m[j+1]
			}
			params[name] = v
		}
		return r, op, params
	}
	return nil, nil, nil
}

// headersOfAnyAnswer are headers of HTTP itself, not of the API: an answer
// may carry them without the document naming them.
var headersOfAnyAnswer = map[string]bool{
	"Content-Type": true, "Content-Length": true, "Date": true, "Vary": true, "Connection": true,
}

// ErrNotDocumented is the error of an answer to a request no operation of
// the document takes (an unknown route, HEAD): nothing was checked.
var ErrNotDocumented = errors.New("conform: no operation of the document takes this request")

// Check checks the answer (status, header, body) to req. req's body is not
// read.
func (c *Checker) Check(req *http.Request, status int, header http.Header, body []byte) error {
	r, op, params := c.find(req.Method, req.URL.EscapedPath())
	if op == nil {
		return ErrNotDocumented
	}
	name := req.Method + " " + r.path
	input := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request:    req,
			PathParams: params,
			Route:      &routers.Route{Spec: c.doc, Path: r.path, PathItem: r.item, Method: req.Method, Operation: op},
		},
		Status:  status,
		Header:  header,
		Body:    io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	var errs []error
	if err := openapi3filter.ValidateResponse(context.Background(), input); err != nil {
		errs = append(errs, err)
	}
	if resp := op.Responses.Status(status); resp != nil && resp.Value != nil {
		var undocumented []string
		for h := range header {
			if headersOfAnyAnswer[h] {
				continue
			}
			if _, ok := lookupHeader(resp.Value.Headers, h); !ok {
				undocumented = append(undocumented, h)
			}
		}
		if len(undocumented) > 0 {
			sort.Strings(undocumented)
			errs = append(errs, fmt.Errorf("headers the document does not name for %d: %s", status, strings.Join(undocumented, ", ")))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s answered %d, which its OpenAPI document does not allow: %w\nheaders: %v\nbody: %.2000s", name, status, err, header, body)
	}
	return nil
}

func lookupHeader(headers openapi3.Headers, name string) (*openapi3.HeaderRef, bool) {
	for h, ref := range headers {
		if strings.EqualFold(h, name) {
			return ref, true
		}
	}
	return nil, false
}

// CheckRequest reports whether the document allows req with body: its
// parameters (headers, path, query) and its body, as a schema-driven
// fuzzer would generate them. Security is not checked (a test sends its
// token). ErrNotDocumented when no operation takes req.
func (c *Checker) CheckRequest(req *http.Request, body []byte) error {
	r, op, params := c.find(req.Method, req.URL.EscapedPath())
	if op == nil {
		return ErrNotDocumented
	}
	req = req.Clone(req.Context())
	req.Body = io.NopCloser(bytes.NewReader(body))
	return openapi3filter.ValidateRequest(context.Background(), &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      &routers.Route{Spec: c.doc, Path: r.path, PathItem: r.item, Method: req.Method, Operation: op},
		Options:    &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true},
	})
}
