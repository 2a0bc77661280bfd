// Package telemetry is valruns' OpenTelemetry tracing: the tracer provider
// built from the standard OTEL_* environment variables (none when no OTLP
// endpoint is set, so tracing off costs nothing), the W3C trace context
// carried through the queue, the PostgreSQL statements' tracer, and the log
// handler that writes trace_id, span_id and request_id on every line.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of valruns' own spans.
const Name = "github.com/valruns/valruns"

// Config is what Setup reads besides the environment.
type Config struct {
	// Version is the service.version resource attribute ("" leaves it out).
	Version string
	// Log receives the exporter's errors (a collector that cannot be
	// reached); nil discards them.
	Log *slog.Logger
}

// ConfigError is a bad OTEL_* value: start-up stops with it.
type ConfigError struct {
	Var, Value, Problem string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s=%q: %s", e.Var, e.Value, e.Problem)
}

// Endpoint is the OTLP endpoint traces go to: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
// else OTEL_EXPORTER_OTLP_ENDPOINT; "" means tracing is off.
func Endpoint() string {
	return cmpEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
}

// Setup builds the tracer provider the OTEL_* environment variables ask
// for, and installs it (and the W3C propagator) as OpenTelemetry's global.
// With no OTLP endpoint set, OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none, tracing is off: it returns a nil provider, installs
// nothing, and valruns builds no span at all. Traces go over OTLP/HTTP
// with protobuf (OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf, the default);
// the exporter reads its other variables itself (OTEL_EXPORTER_OTLP_HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE and their _TRACES_ forms), the
// batch processor OTEL_BSP_*, the sampler OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG, the resource OTEL_SERVICE_NAME (default
// "valruns") and OTEL_RESOURCE_ATTRIBUTES, and the span limits their
// OTEL_*_LIMIT variables (spanLimits: valruns bounds an attribute's length
// by default). shutdown flushes the spans not yet sent; call it on exit.
func Setup(ctx context.Context, cfg Config) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	nothing := func(context.Context) error { return nil }
	if v := os.Getenv("OTEL_SDK_DISABLED"); v != "" {
		off, err := strconv.ParseBool(v)
		if err != nil {
			return nil, nothing, &ConfigError{"OTEL_SDK_DISABLED", v, "want true or false"}
		}
		if off {
			return nil, nothing, nil
		}
	}
	switch v := os.Getenv("OTEL_TRACES_EXPORTER"); v {
	case "", "otlp":
	case "none":
		return nil, nothing, nil
	default:
		return nil, nothing, &ConfigError{"OTEL_TRACES_EXPORTER", v, "valruns exports traces over OTLP only: want otlp or none"}
	}
	if Endpoint() == "" {
		return nil, nothing, nil
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := os.Getenv(name); v != "" && v != "http/protobuf" {
			return nil, nothing, &ConfigError{name, v, "valruns sends traces over OTLP/HTTP with protobuf: want http/protobuf (a collector's port 4318)"}
		}
		if os.Getenv(name) != "" {
			break // the traces-specific one wins
		}
	}
	if err := checkSampler(); err != nil {
		return nil, nothing, err
	}
	limits, err := spanLimits()
	if err != nil {
		return nil, nothing, err
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nothing, &ConfigError{"OTEL_EXPORTER_OTLP_ENDPOINT", Endpoint(), err.Error()}
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", "valruns")}
	if cfg.Version != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.Version))
	}
	// Later detectors win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// over valruns' defaults.
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, nothing, &ConfigError{"OTEL_RESOURCE_ATTRIBUTES", os.Getenv("OTEL_RESOURCE_ATTRIBUTES"), err.Error()}
	}
	// No WithSampler: the SDK takes OTEL_TRACES_SAMPLER (checked above),
	// parentbased_always_on by default, so an incoming traceparent's
	// sampled flag is honoured.
	provider := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithRawSpanLimits(limits))
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry", "error", err)
	}))
	otel.SetTracerProvider(provider)
	otel.SetTextMapPropagator(Propagator)
	return provider, provider.Shutdown, nil
}

// checkSampler refuses a sampler the SDK would replace by its default
// without a word.
func checkSampler() error {
	name := os.Getenv("OTEL_TRACES_SAMPLER")
	switch name {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
		return nil
	case "traceidratio", "parentbased_traceidratio":
		if arg := os.Getenv("OTEL_TRACES_SAMPLER_ARG"); arg != "" {
			f, err := strconv.ParseFloat(arg, 64)
			if err != nil || f < 0 || f > 1 {
				return &ConfigError{"OTEL_TRACES_SAMPLER_ARG", arg, "want a ratio between 0 and 1"}
			}
		}
		return nil
	}
	return &ConfigError{"OTEL_TRACES_SAMPLER", name, "want always_on, always_off, traceidratio, " +
		"parentbased_always_on, parentbased_always_off or parentbased_traceidratio"}
}

// AttributeValueLengthDefault is the longest a span attribute's value
// may be, in characters, when neither OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT
// nor OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT is set: the SDK's own default is
// unlimited, so one long value (an error's text, a client's string) would
// go to the collector whole, and a collector refuses an export request
// past its size limit with every span in it.
const AttributeValueLengthDefault = 4096

// spanLimitVars are the span limits' variables the SDK reads
// (sdktrace.NewSpanLimits); it ignores a value that is not a whole number,
// which would leave a length unlimited without a word.
var spanLimitVars = []string{"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
	"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT",
	"OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT"}

// spanLimits are the SDK's span limits from the environment (counts 128
// by default; a negative value means unlimited), with an attribute's value
// length AttributeValueLengthDefault when no variable sets it.
func spanLimits() (sdktrace.SpanLimits, error) {
	for _, name := range spanLimitVars {
		if v := os.Getenv(name); v != "" {
			if _, err := strconv.Atoi(v); err != nil {
				return sdktrace.SpanLimits{}, &ConfigError{name, v, "want a whole number (negative: no limit)"}
			}
		}
	}
	l := sdktrace.NewSpanLimits()
	if os.Getenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT") == "" && os.Getenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT") == "" {
		l.AttributeValueLengthLimit = AttributeValueLengthDefault
	}
	return l, nil
}

func cmpEnv(names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(os.Getenv(n)); v != "" {
			return v
		}
	}
	return ""
}

// Propagator reads and writes the W3C trace context (traceparent,
// tracestate) and baggage: on HTTP requests and in queued tasks. A
// tracestate is kept to TraceStateMax bytes: every span of the trace
// carries it, in this process and in the worker.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(boundedTraceContext{}, propagation.Baggage{})

// TraceStateMax bounds the tracestate a trace keeps from a client: the
// 512 bytes W3C Trace Context asks every vendor to propagate, where a
// tracestate can be 32 entries of 513 bytes.
const TraceStateMax = 512

// boundedTraceContext is the W3C trace context, its tracestate cut to
// TraceStateMax as the W3C says a vendor may: entries longer than 128 bytes
// go first, then entries from the end.
type boundedTraceContext struct{ propagation.TraceContext }

func (b boundedTraceContext) Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	ctx = b.TraceContext.Extract(ctx, carrier)
	if len(carrier.Get("tracestate")) <= TraceStateMax {
		return ctx
	}
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc.WithTraceState(boundTraceState(sc.TraceState())))
}

func boundTraceState(ts trace.TraceState) trace.TraceState {
	var keys []string
	size := -1 // n entries take n-1 commas
	ts.Walk(func(k, v string) bool {
		n := len(k) + 1 + len(v)
		if n > 128 {
			ts = ts.Delete(k)
			return true
		}
		keys = append(keys, k)
		size += n + 1
		return true
	})
	for i := len(keys) - 1; i >= 0 && size > TraceStateMax; i-- {
		size -= len(keys[i]) + 1 + len(ts.Get(keys[i])) + 1
		ts = ts.Delete(keys[i])
	}
	return ts
}

// Inject is the trace context of ctx's span as a carrier for a task; nil
// when ctx has none (tracing off: nothing is allocated).
func Inject(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := propagation.MapCarrier{}
	Propagator.Inject(ctx, c)
	return c
}

// Extract is ctx with the remote span context that carrier holds (as
// Inject wrote it), if any.
func Extract(ctx context.Context, carrier map[string]string) context.Context {
	if len(carrier) == 0 {
		return ctx
	}
	return Propagator.Extract(ctx, propagation.MapCarrier(carrier))
}

// SpanContextOf is the span context that carrier holds; invalid when none.
func SpanContextOf(carrier map[string]string) trace.SpanContext {
	if len(carrier) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(Extract(context.Background(), carrier))
}

// Tracer is valruns' tracer from tp; nil when tp is (tracing off).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(Name)
}

// PgxTracer is the pgx tracer that gives each PostgreSQL statement a span
// (a batch or pipeline: a span with one child per statement), chained with
// other, a tracer of the caller's own (tests count statements with one);
// tp nil: other as it is.
//
// A span is named by its statement (StatementSpanName: the name of the
// file a statement of the models package comes from, named(sql)), and
// carries no statement text: a new-key start's statements are 5.9 KB of
// SQL, which every traced start's spans would carry to the collector,
// while otelpgx's own name for them was "WITH" or "SELECT".
func PgxTracer(tp trace.TracerProvider, other pgx.QueryTracer, named func(sql string) string) pgx.QueryTracer {
	if tp == nil {
		return other
	}
	t := otelpgx.NewTracer(otelpgx.WithTracerProvider(tp), otelpgx.WithMeterProvider(noopmetric.NewMeterProvider()),
		otelpgx.WithDisableAcquireTracer(), otelpgx.WithDisableSQLStatementInAttributes(),
		otelpgx.WithSpanNameFunc(func(sql string) string { return StatementSpanName(sql, named) }))
	if other == nil {
		return t
	}
	return multitracer.New(t, other)
}

// spanNameMax bounds a span name made of a statement's first line.
const spanNameMax = 100

// StatementSpanName is the span name of the statement sql: named(sql) when
// that is not empty (named may be nil), else the statement's first line,
// at most spanNameMax bytes: the short statements written in the code, and
// GORM's, are one line each, and their text names them.
func StatementSpanName(sql string, named func(sql string) string) string {
	if named != nil {
		if n := named(sql); n != "" {
			return n
		}
	}
	line, _, _ := strings.Cut(strings.TrimSpace(sql), "\n")
	return Clip(strings.TrimSpace(line), spanNameMax)
}

// Clip is s for a span: valid UTF-8 (OTLP's strings must be: one invalid
// string fails the export of every span sent with it) and at most max
// bytes, cut at a character's start and then marked "...".
func Clip(s string, max int) string {
	if len(s) <= max && utf8.ValidString(s) {
		return s
	}
	cut := func(s string) (string, bool) {
		if len(s) <= max {
			return s, false
		}
		i := max
		for i > 0 && i > max-utf8.UTFMax && !utf8.RuneStart(s[i]) {
			i--
		}
		return s[:i], true
	}
	s, clipped := cut(s)
	s = strings.ToValidUTF8(s, "\uFFFD")
	s, again := cut(s) // a replacement is longer than the byte it replaced
	if clipped || again {
		s += "..."
	}
	return s
}

// requestIDKey holds a request's id in a context.
type requestIDKey struct{}

// WithRequestID is ctx carrying the id of the request it serves (or that
// started the run it executes), for the logs.
func WithRequestID(ctx context.Context, id string) context.Context {
	if id == "" {
		return ctx
	}
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestID is the request id ctx carries; "" when none.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// LogHandler wraps h so that every line logged with a context carries the
// context's request_id, and trace_id and span_id when a span is active.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
		}
		if id := RequestID(ctx); id != "" && !hasAttr(r, "request_id") {
			r.AddAttrs(slog.String("request_id", id))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func hasAttr(r slog.Record, key string) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		found = a.Key == key
		return !found
	})
	return found
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(as)}
}

func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }

// Shutdown flushes tp's spans for up to timeout (shutdown from Setup).
func Shutdown(shutdown func(context.Context) error, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
