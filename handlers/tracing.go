package handlers

import (
	"net/http"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/internal/telemetry"
)

// traceRequests gives each request a server span named by its route
// ("POST /api/workflows/{id}/start/"), or by its method alone when no
// route matched, the child of the client's W3C traceparent when it sends
// one. Only installed when tracing is on, before authentication: what a
// client without a token sends lands on the span bounded (url.path:
// urlPathMax bytes, valid UTF-8; the method: a closed set; tracestate:
// telemetry.Propagator's bound); no other header and no query is recorded.
func traceRequests(tp trace.TracerProvider) gin.HandlerFunc {
	tracer := telemetry.Tracer(tp)
	var names sync.Map // method + " " + gin route -> span name
	return func(c *gin.Context) {
		r := c.Request
		method := spanMethod(r.Method)
		route := c.FullPath()
		key := method + " " + route
		name, ok := names.Load(key)
		if !ok {
			name, _ = names.LoadOrStore(key, spanName(method, route))
		}
		ctx := telemetry.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		attrs := []attribute.KeyValue{attribute.String("http.request.method", method), attribute.String("url.path", telemetry.Clip(r.URL.Path, urlPathMax))}
		if route != "" {
			attrs = append(attrs, attribute.String("http.route", docRoute(route)))
		}
		ctx, span := tracer.Start(ctx, name.(string), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		defer span.End()
		c.Request = r.WithContext(ctx)
		c.Next()
		status := c.Writer.Status()
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
	}
}

// urlPathMax bounds the url.path of a request's span: above the longest
// path a route answers (an idempotency key's, with its key of up to 255
// bytes, about 300), far below the megabyte a client may send.
const urlPathMax = 512

// spanMethod is the request's method from a closed set: a client cannot
// grow the span names without bound.
func spanMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions:
		return m
	}
	return "HTTP"
}

// spanName is a request's span name: its method and route as the docs
// write it, or the method alone when no route matched.
func spanName(method, route string) string {
	if route == "" {
		return method
	}
	return method + " " + docRoute(route)
}

// docRoute is a gin route as the API's docs write it: parameters in
// braces, and the /api/ routes with their trailing slash
// (/api/workflows/:id/start: /api/workflows/{id}/start/).
func docRoute(route string) string {
	parts := strings.Split(route, "/")
	for i, p := range parts {
		if len(p) > 1 && (p[0] == ':' || p[0] == '*') {
			parts[i] = "{" + p[1:] + "}"
		}
	}
	out := strings.Join(parts, "/")
	if strings.HasPrefix(out, "/api/") && !strings.HasSuffix(out, "/") {
		out += "/"
	}
	return out
}
