package handlers

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"net/http"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"
	swaggerFiles "github.com/swaggo/files"
	ginSwagger "github.com/swaggo/gin-swagger"

	"github.com/valruns/valruns/docs"
	"github.com/valruns/valruns/problem"
)

// swaggerUI serves Swagger UI at /swagger/index.html, the spec swag
// generated (package docs) at /swagger/doc.json, and the same converted to
// OpenAPI 3 at /swagger/openapi.json and /swagger/openapi.yaml (make docs). The UI's assets are
// embedded in the binary (swaggo/files), so nothing comes from a CDN. Each
// router gets its own file handler: gin-swagger sets the handler's prefix on
// first use, which would race on the shared swaggerFiles.Handler.
// /swagger/ redirects to the UI; any other path under /swagger/ that is not
// one of its files is a 404 problem, as an unknown route is.
func swaggerUI() gin.HandlerFunc {
	spec := specJSON()
	// The options of Swagger UI are in swaggerInitializer, which is served
	// in place of the one gin-swagger would write from them.
	ui := ginSwagger.WrapHandler(swaggerFiles.NewHandler())
	return func(c *gin.Context) {
		switch name := strings.TrimPrefix(c.Param("any"), "/"); {
		case name == "":
			c.Redirect(http.StatusMovedPermanently, "/swagger/index.html")
		case name == "doc.json":
			c.Data(http.StatusOK, "application/json; charset=utf-8", spec)
		case name == "openapi.json":
			c.Data(http.StatusOK, "application/json; charset=utf-8", docs.OpenAPI3JSON)
		case name == "openapi.yaml":
			c.Data(http.StatusOK, "application/yaml; charset=utf-8", docs.OpenAPI3YAML)
		case name == "swagger-initializer.js":
			c.Data(http.StatusOK, "application/javascript; charset=utf-8", swaggerInitializer)
		case !swaggerUIFiles[name]:
			problem.Abort(c, http.StatusNotFound, problem.NotFound, "No route matches "+c.Request.Method+" "+c.Request.URL.Path+".")
		default:
			// gin-swagger picks the file by matching its name in the
			// RequestURI, query included, and takes the text before it as
			// the prefix of every file it serves, once (sync.Once): a first
			// request of /swagger/index.html?x=/zz/swagger-ui.css broke the
			// UI's files for everyone until a restart. It sees a copy of
			// the request naming the file alone, always under /swagger/.
			// And it answers only GET (405 otherwise): a HEAD's copy is a
			// GET, whose body net/http drops as it keeps the HEAD.
			orig := c.Request
			c.Request = orig.Clone(orig.Context())
			c.Request.Method = http.MethodGet
			c.Request.RequestURI = "/swagger/" + name
			c.Request.URL.Path, c.Request.URL.RawPath, c.Request.URL.RawQuery = "/swagger/"+name, "", ""
			ui(c)
			c.Request = orig
		}
	}
}

// swaggerInitializer replaces gin-swagger's swagger-initializer.js: the
// same options, and a request interceptor that sends a new Idempotency-Key
// for every "Try it out" POST whose key field is empty.
//
//go:embed swagger-initializer.js
var swaggerInitializer []byte

// swaggerUIFiles are the files of Swagger UI that gin-swagger serves.
var swaggerUIFiles = map[string]bool{
	"index.html": true, "index.css": true, "swagger-initializer.js": true, "oauth2-redirect.html": true,
	"favicon-16x16.png": true, "favicon-32x32.png": true,
	"swagger-ui.css": true, "swagger-ui.css.map": true, "swagger-ui.js": true, "swagger-ui.js.map": true,
	"swagger-ui-bundle.js": true, "swagger-ui-bundle.js.map": true,
	"swagger-ui-standalone-preset.js": true, "swagger-ui-standalone-preset.js.map": true,
}

// specJSON is the spec of package docs without its "host" member. The spec
// has no host, so that Swagger UI calls whatever address served it, but
// swag's template renders that as "host": "", which Swagger 2.0 does not
// allow (an absent host is how it says "the serving host").
// Built once: ReadDoc renders a template into package state, which parallel
// routers (tests) would race on.
var specJSON = sync.OnceValue(func() []byte {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(docs.SwaggerInfo.ReadDoc()), &doc); err != nil {
		panic("handlers: the generated spec in docs/ is not JSON: " + err.Error()) // caught by every test
	}
	if string(doc["host"]) == `""` {
		delete(doc, "host")
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // keep "queued -> running" readable
	if err := enc.Encode(doc); err != nil {
		panic(err) // cannot happen: re-encoding decoded JSON
	}
	return b.Bytes()
})

// Index is the body of GET /: where to find the API and its documentation.
// Links are paths, valid on whatever address the service listens on.
type Index struct {
	// Name is the service's name.
	Name string `json:"name" validate:"required" example:"valruns"`
	// Version is the release (CHANGELOG.md's newest, what `valruns version`
	// prints): the spec's info.version.
	Version string     `json:"version" validate:"required" example:"0.1.0"`
	Links   IndexLinks `json:"links" validate:"required"`
}

// IndexLinks are the entry points of the service.
type IndexLinks struct {
	// SwaggerUI is the interactive documentation.
	SwaggerUI string `json:"swagger_ui" validate:"required" example:"/swagger/index.html"`
	// OpenAPI is the spec, OpenAPI 3.0 (also /swagger/openapi.yaml): the one
	// Swagger UI shows.
	OpenAPI string `json:"openapi" validate:"required" example:"/swagger/openapi.json"`
	// OpenAPI3 is the same as OpenAPI, kept for the clients of 0.1.0, whose
	// openapi link was the Swagger 2.0 spec.
	OpenAPI3 string `json:"openapi3" validate:"required" example:"/swagger/openapi.json"`
	// Swagger2 is the same spec as Swagger 2.0, as swag generates it.
	Swagger2 string `json:"swagger2" validate:"required" example:"/swagger/doc.json"`
	// Workflows is where the API starts.
	Workflows string `json:"workflows" validate:"required" example:"/api/workflows/"`
	// Health is the liveness probe (/readyz is the readiness probe).
	Health string `json:"health" validate:"required" example:"/healthz"`
	// Metrics are Prometheus metrics.
	Metrics string `json:"metrics" validate:"required" example:"/metrics"`
	// Problems lists the problem codes, each linked to its page.
	Problems string `json:"problems" validate:"required" example:"/problems/"`
}

// index godoc
//
//	@Summary		API index
//	@ID			index
//	@Description	A small JSON index: the service's name and release and links to the Swagger UI, the spec (OpenAPI 3 at /swagger/openapi.json and /swagger/openapi.yaml, Swagger 2.0 at /swagger/doc.json), the API, health, metrics and the problem codes. No authentication.
//	@Tags			meta
//	@Produce		json
//	@Success		200	{object}	Index
//	@Router			/ [get]
func index(c *gin.Context) {
	c.PureJSON(http.StatusOK, Index{
		Name:    "valruns",
		Version: docs.SwaggerInfo.Version,
		Links: IndexLinks{
			SwaggerUI: "/swagger/index.html",
			OpenAPI:   "/swagger/openapi.json",
			OpenAPI3:  "/swagger/openapi.json",
			Swagger2:  "/swagger/doc.json",
			Workflows: "/api/workflows/",
			Health:    "/healthz",
			Metrics:   "/metrics",
			Problems:  "/problems/",
		},
	})
}

// The types below exist for the OpenAPI spec only: each is the problem
// document (problem.Details) that a status answers, named for the spec's
// readers and client generators: one type per status, since the problems of
// a status differ only in their example. The examples a reader sees are answers
// the API gave (package internal/apispec); the example tags here only show
// in the spec's models, and TestSpecProblemExamples checks that each is
// what problem.New makes of its status, code and detail.

// ProblemBadRequest is a 400 problem: the request is malformed
// (validation_error, invalid_json...), or a schema or assertion of a
// workflow does not compile (invalid_workflow).
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 400, Content-Type application/problem+json.
type ProblemBadRequest struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/validation_error"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Bad Request"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"400"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"limit must be a whole number from 1 to 100."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"validation_error"`
}

// ProblemUnauthorized is a 401 problem: no usable API token.
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 401, Content-Type application/problem+json.
type ProblemUnauthorized struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/invalid_token"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Unauthorized"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"401"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"The API token is unknown or revoked."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"invalid_token"`
}

// ProblemNotFound is a 404 problem: no such workflow, run, idempotency key,
// webhook endpoint or delivery in the caller's organisation.
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 404, Content-Type application/problem+json.
type ProblemNotFound struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/not_found"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Not Found"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"404"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"Workflow not found."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"not_found"`
}

// ProblemInProgress is a 409 problem: the idempotency key's first request is still being processed.
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 409, Content-Type application/problem+json.
type ProblemInProgress struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/idempotency_key_in_progress"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Conflict"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"409"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"A request with this idempotency key is currently being processed."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"idempotency_key_in_progress"`
}

// ProblemTooLarge is a 413 problem: the body exceeds MAX_BODY_BYTES.
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 413, Content-Type application/problem+json.
type ProblemTooLarge struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/request_body_too_large"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Request Entity Too Large"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"413"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"The request body exceeds the limit of 1048576 bytes."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"request_body_too_large"`
}

// ProblemBodyTimeout is a 408 problem: the body arrived slower than the server's read timeout.
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 408, Content-Type application/problem+json.
type ProblemBodyTimeout struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/request_body_timeout"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Request Timeout"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"408"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"The request body did not arrive in time; nothing was done. Send the request again."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"request_body_timeout"`
}

// ProblemUnsupportedEncoding is a 415 problem: a Content-Encoding the server does not decode.
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 415, Content-Type application/problem+json.
type ProblemUnsupportedEncoding struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/unsupported_content_encoding"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Unsupported Media Type"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"415"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"Content-Encoding \"br\" is not accepted: send the body as is, or gzip-encoded."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"unsupported_content_encoding"`
}

// ProblemKeyReused is a 422 problem: the idempotency key was used with another request.
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 422, Content-Type application/problem+json.
type ProblemKeyReused struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/idempotency_key_reused"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Unprocessable Entity"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"422"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"Idempotency key has already been used with a different request body."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"idempotency_key_reused"`
}

// ProblemTooManyRequests is a 429 problem. Of a start: quota_exceeded (the
// organisation's monthly run quota is used up; stored and replayed) or
// rate_limited (it started runs faster than its rate; nothing stored). Of a
// webhook test event: test_events_pending (the endpoint has as many test
// events waiting for their attempt as it may).
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 429, Content-Type application/problem+json.
type ProblemTooManyRequests struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/quota_exceeded"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Too Many Requests"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"429"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"The organisation has used its monthly quota of 1000 runs."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"quota_exceeded"`
}

// ProblemInternal is a 500 problem: something failed inside and nothing was done.
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 500, Content-Type application/problem+json.
type ProblemInternal struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/internal_error"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Internal Server Error"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"500"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"An internal error occurred."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"internal_error"`
}

// ProblemUnavailable is a 503 problem: retry after Retry-After seconds (with the
// same key: its detail says when the outcome is unknown).
//
//	@Description	An RFC 9457 problem document (problem.Details) answered with 503, Content-Type application/problem+json.
type ProblemUnavailable struct {
	problem.Details
	// Type is a URI reference naming the kind of problem: /problems/ followed by the code, the path of its page.
	Type string `json:"type" example:"/problems/service_unavailable"`
	// Title is the HTTP status text.
	Title string `json:"title" example:"Service Unavailable"`
	// Status repeats the HTTP status code.
	Status int `json:"status" example:"503"`
	// Detail explains this occurrence, for people.
	Detail string `json:"detail" example:"The database is unavailable; retry shortly."`
	// Code is the stable machine-readable code: switch on it, not on detail.
	Code string `json:"code" example:"service_unavailable"`
}
