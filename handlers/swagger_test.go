package handlers_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/go-openapi/loads"
	"github.com/go-openapi/spec"
	"github.com/go-openapi/strfmt"
	"github.com/go-openapi/validate"
	"github.com/stretchr/testify/require"

	"github.com/valruns/valruns/handlers"
	"github.com/valruns/valruns/problem"
)

// specFile is the spec swag generated (make docs).
const specFile = "../docs/swagger.json"

// get answers a GET through the real router with trailing-slash handling.
// The routes under test here touch no database, so the router needs none.
func get(t *testing.T, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	handlers.New(handlers.Deps{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}

func loadSpecFile(t *testing.T) *loads.Document {
	t.Helper()
	doc, err := loads.Spec(specFile)
	require.NoError(t, err, "load %s (run make docs)", specFile)
	return doc
}

func loadServedSpec(t *testing.T) *loads.Document {
	t.Helper()
	rec := get(t, "/swagger/doc.json")
	require.Equal(t, http.StatusOK, rec.Code, "body %s", rec.Body)
	require.Contains(t, rec.Header().Get("Content-Type"), "application/json")
	doc, err := loads.Analyzed(json.RawMessage(rec.Body.Bytes()), "")
	require.NoError(t, err)
	return doc
}

func TestSpecValidSwagger2(t *testing.T) {
	t.Parallel()
	for name, load := range map[string]func(*testing.T) *loads.Document{
		"docs/swagger.json":        loadSpecFile,
		"served /swagger/doc.json": loadServedSpec,
	} {
		t.Run(name, func(t *testing.T) {
			doc := load(t)
			require.Equal(t, "2.0", doc.Spec().Swagger)
			require.NoError(t, validate.Spec(doc, strfmt.Default))
			// No host: Swagger UI then calls whatever address served the page.
			require.Empty(t, doc.Spec().Host, "host must stay empty so the spec works on any address")
			require.Equal(t, "/", doc.Spec().BasePath)
			require.Equal(t, "valruns API", doc.Spec().Info.Title)
			require.NotEmpty(t, doc.Spec().Info.Version)
			require.Contains(t, doc.Spec().Info.Description, "Idempotency-Key")
		})
	}
}

// The served spec is the committed one: same paths and definitions.
func TestSpecServedIsGenerated(t *testing.T) {
	t.Parallel()
	file, served := loadSpecFile(t).Spec(), loadServedSpec(t).Spec()
	require.Equal(t, file.Paths, served.Paths)
	require.Equal(t, file.Definitions, served.Definitions)
	require.Equal(t, file.SecurityDefinitions, served.SecurityDefinitions)
}

var ginParam = regexp.MustCompile(`:([A-Za-z_][A-Za-z0-9_]*)`)

// routeKey is "METHOD /path" with {param} placeholders and no trailing slash.
func routeKey(method, path string) string {
	path = ginParam.ReplaceAllString(path, "{$1}")
	if len(path) > 1 {
		path = strings.TrimSuffix(path, "/")
	}
	return method + " " + path
}

func specRoutes(sw *spec.Swagger) map[string]*spec.Operation {
	out := map[string]*spec.Operation{}
	for path, item := range sw.Paths.Paths {
		for method, op := range map[string]*spec.Operation{
			http.MethodGet: item.Get, http.MethodPost: item.Post, http.MethodPut: item.Put,
			http.MethodPatch: item.Patch, http.MethodDelete: item.Delete,
			http.MethodHead: item.Head, http.MethodOptions: item.Options,
		} {
			if op != nil {
				out[routeKey(method, path)] = op
			}
		}
	}
	return out
}

// Every route the router serves is in the spec, and every operation of the
// spec is a route the router serves.
func TestSpecRouteCoverage(t *testing.T) {
	t.Parallel()
	routes := map[string]bool{}
	for _, r := range handlers.NewRouter(handlers.Deps{}).Routes() {
		if r.Path == "/swagger/*any" || r.Method == http.MethodHead { // every GET route answers HEAD too
			continue
		}
		routes[routeKey(r.Method, r.Path)] = true
	}
	documented := specRoutes(loadSpecFile(t).Spec())

	var undocumented, unrouted []string
	for k := range routes {
		if documented[k] == nil {
			undocumented = append(undocumented, k)
		}
	}
	for k := range documented {
		if !routes[k] {
			unrouted = append(unrouted, k)
		}
	}
	sort.Strings(undocumented)
	sort.Strings(unrouted)
	require.Empty(t, undocumented, "routes missing from docs/swagger.json: annotate them and run make docs")
	require.Empty(t, unrouted, "spec operations without a route")
	require.GreaterOrEqual(t, len(routes), 10)

	// Every operation is described, and the API's declare their errors.
	for k, op := range documented {
		require.NotEmpty(t, op.Summary, k)
		require.NotEmpty(t, op.Description, k)
		require.NotEmpty(t, op.Tags, k)
		for code, resp := range op.Responses.StatusCodeResponses {
			require.Contains(t, resp.Headers, "X-Request-Id", "%s %d", k, code)
			if code >= 400 {
				require.NotNil(t, resp.Schema, "%s %d has no schema", k, code)
			}
			if code >= 500 {
				require.Contains(t, resp.Headers, "Retry-After", "%s %d: every 5xx says when to retry", k, code)
			}
		}
		if strings.Contains(k, " /api/") {
			require.Len(t, op.Security, 1, k)
			require.Contains(t, op.Security[0], "BearerAuth", k)
			for _, code := range []int{401, 500, 503} {
				require.Contains(t, op.Responses.StatusCodeResponses, code, "%s does not document %d", k, code)
			}
		}
	}
}

func TestSpecSecurityDefinition(t *testing.T) {
	t.Parallel()
	sd := loadSpecFile(t).Spec().SecurityDefinitions["BearerAuth"]
	require.NotNil(t, sd)
	require.Equal(t, "apiKey", sd.Type)
	require.Equal(t, "header", sd.In)
	require.Equal(t, "Authorization", sd.Name)
	require.Contains(t, sd.Description, "Bearer vr_")
}

func TestSpecIdempotentPosts(t *testing.T) {
	t.Parallel()
	sw := loadSpecFile(t).Spec()
	ops := specRoutes(sw)
	for _, k := range []string{"POST /api/workflows", "POST /api/workflows/{id}/start"} {
		t.Run(k, func(t *testing.T) {
			op := ops[k]
			require.NotNil(t, op, "%s is not in the spec", k)
			headerParam := func(name string) *spec.Parameter {
				for i := range op.Parameters {
					if p := &op.Parameters[i]; p.In == "header" && p.Name == name {
						return p
					}
				}
				t.Fatalf("no %s header parameter", name)
				return nil
			}

			// The key: what to send, and its rules as the server checks
			// them; no example, so that Swagger UI hands no two visitors
			// the same key (it sends a new one for an empty field).
			key := headerParam("Idempotency-Key")
			require.Equal(t, "string", key.Type)
			require.False(t, key.Required, "optional unless IDEMPOTENCY_KEY_REQUIRED=true")
			require.NotContains(t, key.Extensions, "x-example", "a fixed example key would be every visitor's key")
			require.Nil(t, key.Example)
			require.EqualValues(t, 1, *key.MinLength)
			require.EqualValues(t, 255, *key.MaxLength)
			require.NotEmpty(t, key.Pattern)
			require.Less(t, len(key.Description), 400, "the parameter says what to send; the rules are in the tag's description")
			for _, rule := range []string{"IDEMPOTENCY_KEY_REQUIRED", "255 printable ASCII", "UUID", "422", "409"} {
				require.Contains(t, key.Description, rule)
			}
			// The operation reads at a glance; the rules are its tag's.
			require.Less(t, len(op.Description), 700, "the operation's description is short: %q", op.Description)
			require.Len(t, op.Tags, 1)
			var tagDesc string
			for _, tag := range sw.Tags {
				if tag.Name == op.Tags[0] {
					tagDesc = tag.Description
				}
			}
			require.Contains(t, op.Description, "**"+op.Tags[0]+"**", "the operation points to its tag's rules")
			for _, rule := range []string{"IDEMPOTENCY_KEY_REQUIRED", "255 printable ASCII", "24 h", "Idempotency-Key-Expires",
				"Idempotent-Replayed: true", "Original-Request-Id", "422", "409", "Retry-After",
				"Prefer: wait=N", "IDEMPOTENCY_MAX_WAIT", "Preference-Applied: wait=N", "5xx"} {
				require.Contains(t, tagDesc, rule)
			}

			prefer := headerParam("Prefer")
			require.Equal(t, "string", prefer.Type)
			require.False(t, prefer.Required)
			require.Regexp(t, `^wait=[1-9][0-9]*$`, prefer.Extensions["x-example"])
			for _, rule := range []string{"RFC 7240", "wait=N", "IDEMPOTENCY_MAX_WAIT", "Preference-Applied: wait=N", "409"} {
				require.Contains(t, prefer.Description, rule)
			}

			resps := op.Responses.StatusCodeResponses
			for _, code := range []int{201, 400, 401, 409, 413, 422, 500, 503} {
				require.Contains(t, resps, code, "%s does not document %d", k, code)
			}
			created := resps[201]
			for _, h := range []string{"Location", "Idempotent-Replayed", "Original-Request-Id", "Idempotency-Key-Expires", "Preference-Applied", "X-Request-Id"} {
				require.Contains(t, created.Headers, h, "201 header %s", h)
			}
			require.Contains(t, resps[422].Headers, "Idempotency-Key-Expires")
			require.Contains(t, resps[422].Headers, "Preference-Applied")
			require.Contains(t, resps[422].Headers["Idempotency-Key-Expires"].Description, "HTTP-date")
			require.Contains(t, resps[409].Headers, "Retry-After")
			require.Equal(t, "#/definitions/handlers.ProblemInProgress", resps[409].Schema.Ref.String())
			require.Equal(t, "#/definitions/handlers.ProblemKeyReused", resps[422].Schema.Ref.String())
		})
	}
	require.Contains(t, ops["POST /api/workflows/{id}/start"].Responses.StatusCodeResponses, 429)
	require.Contains(t, ops["POST /api/workflows/{id}/start"].Responses.StatusCodeResponses, 404)
}

// Request and response bodies are named types, never free-form maps.
func TestSpecNamedSchemas(t *testing.T) {
	t.Parallel()
	for k, op := range specRoutes(loadSpecFile(t).Spec()) {
		for _, p := range op.Parameters {
			if p.In == "body" {
				require.NotEmpty(t, p.Schema.Ref.String(), "%s body is not a named type", k)
			}
		}
		for code, resp := range op.Responses.StatusCodeResponses {
			if resp.Schema == nil || resp.Schema.Type.Contains("string") { // text: metrics, problem pages
				continue
			}
			require.NotEmpty(t, resp.Schema.Ref.String(), "%s %d is not a named type", k, code)
		}
	}
}

// Each problem example of the spec is a document problem.New could make:
// its type, title and status follow from its status and code, and the
// fields are problem.Details'.
func TestSpecProblemExamples(t *testing.T) {
	t.Parallel()
	detailsFields := jsonFields(reflect.TypeOf(problem.Details{}))
	defs := loadSpecFile(t).Spec().Definitions
	for _, v := range []any{
		handlers.ProblemBadRequest{}, handlers.ProblemUnauthorized{}, handlers.ProblemNotFound{},
		handlers.ProblemBodyTimeout{}, handlers.ProblemInProgress{}, handlers.ProblemTooLarge{},
		handlers.ProblemUnsupportedEncoding{}, handlers.ProblemKeyReused{}, handlers.ProblemTooManyRequests{},
		handlers.ProblemInternal{}, handlers.ProblemUnavailable{},
	} {
		typ := reflect.TypeOf(v)
		t.Run(typ.Name(), func(t *testing.T) {
			ex := map[string]string{}
			for i := 0; i < typ.NumField(); i++ {
				f := typ.Field(i)
				if !f.Anonymous {
					ex[strings.Split(f.Tag.Get("json"), ",")[0]] = f.Tag.Get("example")
				}
			}
			status, err := strconv.Atoi(ex["status"])
			require.NoError(t, err)
			code, ok := problem.Lookup(ex["code"])
			require.True(t, ok, "code %q has no page", ex["code"])
			require.Contains(t, code.Statuses, status, "code %q", ex["code"])
			want := problem.New(status, code.Code, ex["detail"])
			require.Equal(t, want.Type, ex["type"])
			require.Equal(t, want.Title, ex["title"])
			require.NotEmpty(t, want.Detail)

			def, ok := defs["handlers."+typ.Name()]
			require.True(t, ok, "%s is not in the spec", typ.Name())
			var props []string
			for name := range def.Properties {
				props = append(props, name)
			}
			sort.Strings(props)
			require.Equal(t, detailsFields, props, "%s documents exactly problem.Details' fields", typ.Name())
		})
	}
}

func jsonFields(typ reflect.Type) []string {
	var out []string
	for i := 0; i < typ.NumField(); i++ {
		if name := strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]; name != "" && name != "-" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Swagger UI and its assets come from the binary, never from a CDN.
func TestSwaggerUIServed(t *testing.T) {
	t.Parallel()
	rec := get(t, "/swagger/index.html")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Contains(t, rec.Header().Get("Content-Type"), "text/html")
	page := rec.Body.String()
	require.Contains(t, page, "swagger-ui-bundle.js")
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(page, -1) {
		require.False(t, strings.Contains(m[1], "//"), "index.html loads %s from elsewhere", m[1])
	}
	for _, asset := range []string{"swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "swagger-initializer.js", "swagger-ui.css", "index.css"} {
		rec := get(t, "/swagger/"+asset)
		require.Equal(t, http.StatusOK, rec.Code, asset)
		require.NotZero(t, rec.Body.Len(), asset)
	}
	init := get(t, "/swagger/swagger-initializer.js").Body.String()
	require.Contains(t, init, `url: "openapi.json"`, "the UI loads the OpenAPI 3 document from its own directory")
	require.Contains(t, init, "validatorUrl: null", "no call to an online validator")
}

// HEAD on the UI's files answers what GET would, without a body, over a real
// server (the recorder of get keeps bodies that net/http drops for HEAD).
func TestSwaggerHead(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(handlers.New(handlers.Deps{}))
	t.Cleanup(srv.Close)
	for _, path := range []string{"/swagger/index.html", "/swagger/swagger-ui.css", "/swagger/doc.json", "/"} {
		getResp, err := http.Get(srv.URL + path)
		require.NoError(t, err, path)
		getResp.Body.Close()
		headResp, err := http.Head(srv.URL + path)
		require.NoError(t, err, path)
		headResp.Body.Close()
		require.Equal(t, http.StatusOK, headResp.StatusCode, path)
		require.Equal(t, getResp.Header.Get("Content-Type"), headResp.Header.Get("Content-Type"), path)

		// On the wire: the status line and headers, then nothing.
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		require.NoError(t, err)
		_, err = conn.Write([]byte("HEAD " + path + " HTTP/1.0\r\nHost: x\r\n\r\n"))
		require.NoError(t, err)
		raw, err := io.ReadAll(conn)
		conn.Close()
		require.NoError(t, err)
		_, after, found := strings.Cut(string(raw), "\r\n\r\n")
		require.True(t, found, "%s: %q", path, raw)
		require.Empty(t, after, "%s: HEAD sent a body", path)
	}
	headResp, err := http.Head(srv.URL + "/swagger/unknown.js")
	require.NoError(t, err)
	headResp.Body.Close()
	require.Equal(t, http.StatusNotFound, headResp.StatusCode)
}

// /swagger/ leads to the UI, and a path under /swagger/ that is none of its
// files is the problem+json 404 of any unknown route.
func TestSwaggerPaths(t *testing.T) {
	t.Parallel()
	rec := get(t, "/swagger/")
	require.Equal(t, http.StatusMovedPermanently, rec.Code)
	require.Equal(t, "/swagger/index.html", rec.Header().Get("Location"))

	unknown := get(t, "/nothing-here")
	for _, path := range []string{"/swagger/anything-unknown", "/swagger/x/index.html", "/swagger/swagger-ui-es-bundle.js", "/swagger/index.html/"} {
		rec := get(t, path)
		require.Equal(t, http.StatusNotFound, rec.Code, path)
		require.Equal(t, problem.ContentType, rec.Header().Get("Content-Type"), path)
		var d, u problem.Details
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &d), path)
		require.NoError(t, json.Unmarshal(unknown.Body.Bytes(), &u))
		require.Equal(t, "not_found", d.Code, path)
		require.Equal(t, "No route matches GET "+path+".", d.Detail)
		require.Equal(t, path, d.Instance)
		require.Equal(t, strings.Replace(u.Detail, "/nothing-here", path, 1), d.Detail, "the same answer as an unknown route")
		require.Equal(t, u.Type, d.Type)
	}
	// The UI's files are still served after an unknown one was asked for
	// (gin-swagger learns its prefix from the first path it serves).
	require.Equal(t, http.StatusOK, get(t, "/swagger/swagger-ui.css").Code)
}

func TestSwaggerIndexRoute(t *testing.T) {
	t.Parallel()
	rec := get(t, "/")
	require.Equal(t, http.StatusOK, rec.Code)
	var idx handlers.Index
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &idx))
	require.Equal(t, "valruns", idx.Name)
	require.Equal(t, loadSpecFile(t).Spec().Info.Version, idx.Version)
	require.Equal(t, handlers.IndexLinks{
		SwaggerUI: "/swagger/index.html", OpenAPI: "/swagger/openapi.json", OpenAPI3: "/swagger/openapi.json", Swagger2: "/swagger/doc.json",
		Workflows: "/api/workflows/", Health: "/healthz", Metrics: "/metrics", Problems: "/problems/",
	}, idx.Links)
	for _, link := range []string{idx.Links.SwaggerUI, idx.Links.OpenAPI, idx.Links.OpenAPI3, idx.Links.Swagger2, idx.Links.Health, idx.Links.Metrics, idx.Links.Problems} {
		require.Equal(t, http.StatusOK, get(t, link).Code, link)
	}
	require.Equal(t, http.StatusUnauthorized, get(t, idx.Links.Workflows).Code, "the API needs a token")
	var spec struct {
		OpenAPI, Swagger string
	}
	require.NoError(t, json.Unmarshal(get(t, idx.Links.OpenAPI).Body.Bytes(), &spec))
	require.True(t, strings.HasPrefix(spec.OpenAPI, "3."), "the openapi link is the OpenAPI 3 document: %+v", spec)
	spec.OpenAPI = ""
	require.NoError(t, json.Unmarshal(get(t, idx.Links.Swagger2).Body.Bytes(), &spec))
	require.Equal(t, "2.0", spec.Swagger)
}

// docs/ holds exactly what make docs writes.
func TestSwaggerDocsFiles(t *testing.T) {
	t.Parallel()
	for _, f := range []string{"../docs/docs.go", "../docs/swagger.json", "../docs/swagger.yaml"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err, "run make docs")
		require.NotContains(t, string(b), "Code generated by swaggo/swag at", "docs carry no timestamp (no --generatedTime)")
	}
	b, err := os.ReadFile("../docs/swagger.json")
	require.NoError(t, err)
	var raw map[string]any
	require.NoError(t, json.Unmarshal(b, &raw))
	_, hasHost := raw["host"]
	require.False(t, hasHost, "docs/swagger.json has no host")
}

// The OpenAPI 3 document is served as committed (docs/openapi.json and
// .yaml, converted by make docs), and says what the Swagger 2.0 one does:
// the same operations.
func TestSpecOpenAPI3Served(t *testing.T) {
	t.Parallel()
	for path, file := range map[string]string{"/swagger/openapi.json": "../docs/openapi.json", "/swagger/openapi.yaml": "../docs/openapi.yaml"} {
		rec := get(t, path)
		require.Equal(t, http.StatusOK, rec.Code, path)
		want, err := os.ReadFile(file)
		require.NoError(t, err, "run make docs")
		require.Equal(t, string(want), rec.Body.String(), "%s serves %s", path, file)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(get(t, "/swagger/openapi.json").Body.Bytes(), &doc))
	require.Regexp(t, `^3\.`, doc.OpenAPI)
	v3 := map[string]bool{}
	for p, item := range doc.Paths {
		for m := range item {
			v3[routeKey(strings.ToUpper(m), p)] = true
		}
	}
	for k := range specRoutes(loadSpecFile(t).Spec()) {
		require.True(t, v3[k], "%s is in the OpenAPI 3 document", k)
	}
	require.Len(t, v3, len(specRoutes(loadSpecFile(t).Spec())))
}

// Public routes say so (security: []); every /api/ route needs the token.
func TestSpecSecurityExplicit(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/openapi.json")
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]struct {
			Security *[]map[string][]string `json:"security"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	for p, item := range doc.Paths {
		for m, op := range item {
			require.NotNil(t, op.Security, "%s %s states its security", m, p)
			if strings.HasPrefix(p, "/api/") {
				require.Equal(t, []map[string][]string{{"BearerAuth": {}}}, *op.Security, "%s %s", m, p)
			} else {
				require.Empty(t, *op.Security, "%s %s is public", m, p)
			}
		}
	}
}

// escaped is a backslash escape left in a text, such as the \"org\" swag
// keeps of a quote in an annotation, which the UI then shows as written.
// (\u0000 is not one: the descriptions name the NUL character by its JSON
// escape on purpose.)
var escaped = regexp.MustCompile(`\\["\\/bfnrt]`)

// Every description of both documents reads as written, without a
// backslash escape: a quote in an annotation is written bare.
func TestSpecDescriptionsUnescaped(t *testing.T) {
	t.Parallel()
	for _, file := range []string{specFile, "../docs/openapi.json"} {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		var doc any
		require.NoError(t, json.Unmarshal(b, &doc))
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch v := v.(type) {
			case map[string]any:
				for k, x := range v {
					walk(path+"/"+k, x)
				}
			case []any:
				for i, x := range v {
					walk(path+"/"+strconv.Itoa(i), x)
				}
			case string:
				if strings.HasSuffix(path, "/description") {
					require.False(t, escaped.MatchString(v), "%s %s shows a backslash escape: %q", file, path, escaped.FindString(v))
				}
			}
		}
		walk("", doc)
	}
}

// TestSwaggerUIFirstRequestCannotBreakIt: gin-swagger learns the prefix of
// the files it serves from the first request it sees, query included. A
// fresh router whose first UI request is a crafted one still serves
// index.html, the CSS and the JS, each as a router that saw only plain
// requests does: the crafted request is index.html's too.
func TestSwaggerUIFirstRequestCannotBreakIt(t *testing.T) {
	t.Parallel()
	files := []string{"index.html", "index.css", "swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "favicon-32x32.png"}
	serve := func(h http.Handler, target string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
		return rec
	}
	plain := handlers.New(handlers.Deps{})
	want := map[string]*httptest.ResponseRecorder{}
	for _, f := range files {
		want[f] = serve(plain, "/swagger/"+f)
		require.Equal(t, http.StatusOK, want[f].Code, f)
	}
	for _, crafted := range []string{
		"/swagger/index.html?x=/zz/swagger-ui.css",
		"/swagger/index.html?swagger-ui-bundle.js",
		"/swagger/index.html?a=index.css&b=/x/y/favicon-32x32.png",
		"/swagger/%69ndex.html?x=/zz/swagger-ui.js",
	} {
		t.Run(crafted, func(t *testing.T) {
			t.Parallel()
			h := handlers.New(handlers.Deps{}) // a fresh router: nothing learnt yet
			rec := serve(h, crafted)
			require.Equal(t, http.StatusOK, rec.Code)
			require.Equal(t, want["index.html"].Header().Get("Content-Type"), rec.Header().Get("Content-Type"))
			require.Equal(t, want["index.html"].Body.String(), rec.Body.String(), "the crafted request is answered index.html")
			for _, f := range files {
				got := serve(h, "/swagger/"+f)
				require.Equal(t, http.StatusOK, got.Code, "%s after %s: %.200s", f, crafted, got.Body)
				require.Equal(t, want[f].Header().Get("Content-Type"), got.Header().Get("Content-Type"), f)
				require.True(t, bytes.Equal(want[f].Body.Bytes(), got.Body.Bytes()), "%s: not the file", f)
			}
		})
	}
}
