package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/valruns/valruns/internal/otlptest"
	"github.com/valruns/valruns/internal/telemetry"
)

// clearEnv unsets every OTEL_* variable Setup reads, for the test.
func clearEnv(t *testing.T) {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER",
		"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
		"OTEL_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
		"OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT"} {
		t.Setenv(name, "")
	}
}

func TestSetupOff(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"no endpoint":                        {},
		"OTEL_TRACES_EXPORTER=none":          {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"},
		"OTEL_SDK_DISABLED=true":             {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
		"sampler set but no endpoint at all": {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_SERVICE_NAME": "x"},
	} {
		t.Run(name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range env {
				t.Setenv(k, v)
			}
			tp, shutdown, err := telemetry.Setup(context.Background(), telemetry.Config{})
			require.NoError(t, err)
			require.Nil(t, tp, "no tracer provider without an endpoint")
			require.NoError(t, shutdown(context.Background()))
			require.Nil(t, telemetry.Tracer(tp))
			// The pgx tracer is the caller's own, untouched.
			require.Nil(t, telemetry.PgxTracer(tp, nil, nil))
		})
	}
}

func TestSetupRefusesBadValues(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
		{"OTEL_TRACES_SAMPLER", "sometimes", "OTEL_TRACES_SAMPLER"},
		{"OTEL_TRACES_EXPORTER", "zipkin", "OTEL_TRACES_EXPORTER"},
		{"OTEL_SDK_DISABLED", "maybe", "OTEL_SDK_DISABLED"},
		{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4k", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"},
		{"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "lots", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"},
	} {
		t.Run(c.name+"="+c.value, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
			t.Setenv(c.name, c.value)
			_, _, err := telemetry.Setup(context.Background(), telemetry.Config{})
			var ce *telemetry.ConfigError
			require.True(t, errors.As(err, &ce), "%v", err)
			require.Equal(t, c.want, ce.Var)
		})
	}
	t.Run("OTEL_TRACES_SAMPLER_ARG out of range", func(t *testing.T) {
		clearEnv(t)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
		t.Setenv("OTEL_TRACES_SAMPLER", "traceidratio")
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", "2")
		_, _, err := telemetry.Setup(context.Background(), telemetry.Config{})
		var ce *telemetry.ConfigError
		require.True(t, errors.As(err, &ce), "%v", err)
		require.Equal(t, "OTEL_TRACES_SAMPLER_ARG", ce.Var)
	})
}

// exportOne sets tracing up from the environment (with the receiver as
// endpoint), makes one span and flushes it; it returns what the receiver got.
func exportOne(t *testing.T, env map[string]string) []otlptest.Span {
	return exportSpan(t, env, nil)
}

// exportSpan is exportOne with set, when not nil, setting the span's
// attributes.
func exportSpan(t *testing.T, env map[string]string, set func(trace.Span)) []otlptest.Span {
	r, err := otlptest.Start(true)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	clearEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.URL)
	for k, v := range env {
		t.Setenv(k, v)
	}
	tp, shutdown, err := telemetry.Setup(context.Background(), telemetry.Config{Version: "v9.9.9"})
	require.NoError(t, err)
	require.NotNil(t, tp)
	_, span := telemetry.Tracer(tp).Start(context.Background(), "one")
	if set != nil {
		set(span)
	}
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, shutdown(ctx)) // flushes
	return r.Spans()
}

func TestSetupExportsOverOTLPHTTP(t *testing.T) {
	spans := exportOne(t, map[string]string{"OTEL_SERVICE_NAME": "valruns-test", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
	require.Len(t, spans, 1)
	require.Equal(t, "one", spans[0].Name)
	require.Equal(t, "valruns-test", spans[0].Service, "OTEL_SERVICE_NAME names the service")

	spans = exportOne(t, nil)
	require.Len(t, spans, 1)
	require.Equal(t, "valruns", spans[0].Service, "the default service name")
}

// TestSpanLimits: an attribute's value is cut to
// AttributeValueLengthDefault characters when no variable says otherwise
// (the SDK alone would send it whole), and the OTEL_*_LIMIT variables,
// general and span-specific, are honoured.
func TestSpanLimits(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	many := func(span trace.Span) {
		span.SetAttributes(attribute.String("long", long))
		for i := range 200 {
			span.SetAttributes(attribute.Int(fmt.Sprintf("n%03d", i), i))
		}
	}
	for _, c := range []struct {
		name          string
		env           map[string]string
		length, count int
	}{
		{"defaults", nil, telemetry.AttributeValueLengthDefault, 128},
		{"general", map[string]string{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100", "OTEL_ATTRIBUTE_COUNT_LIMIT": "10"}, 100, 10},
		{"span-specific first", map[string]string{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100",
			"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "50", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "5"}, 50, 5},
		{"no limit asked for", map[string]string{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "-1"}, len(long), 128},
	} {
		t.Run(c.name, func(t *testing.T) {
			spans := exportSpan(t, c.env, many)
			require.Len(t, spans, 1)
			require.Equal(t, c.length, len(spans[0].Attrs["long"]), "the long value's length")
			require.Equal(t, c.count, len(spans[0].Attrs), "the attributes kept")
		})
	}
}

func TestClip(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"/api/runs/", 10, "/api/runs/"},
		{"/api/runs/x", 10, "/api/runs/..."},
		{"/é", 2, "/..."},              // not half of é
		{"/\xff\xfe/", 10, "/\uFFFD/"}, // OTLP strings must be UTF-8
		{"\xff\xff\xff\xff", 2, "..."}, // U+FFFD is 3 bytes
		{strings.Repeat("\x80", 1<<20), 8, "\uFFFD..."},
	} {
		got := telemetry.Clip(c.in, c.max)
		require.Equal(t, c.want, got, "%q", c.in)
		require.True(t, utf8.ValidString(got))
	}
}

func TestSamplerAlwaysOffSendsNoSpan(t *testing.T) {
	require.Empty(t, exportOne(t, map[string]string{"OTEL_TRACES_SAMPLER": "always_off"}))
	// The same set-up with the sampler on does send it (the receiver works).
	require.Len(t, exportOne(t, map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}), 1)
}

func TestCarrierRoundTrip(t *testing.T) {
	require.Nil(t, telemetry.Inject(context.Background()), "nothing to carry without a span")
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	c := telemetry.Inject(trace.ContextWithSpanContext(context.Background(), sc))
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", c["traceparent"])
	got := telemetry.SpanContextOf(c)
	require.Equal(t, tid, got.TraceID())
	require.Equal(t, sid, got.SpanID())
	require.True(t, got.IsRemote())
}

func TestLogHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	var raw string
	line := func() map[string]any {
		var m map[string]any
		raw = buf.String()
		require.NoError(t, json.Unmarshal(buf.Bytes(), &m))
		buf.Reset()
		return m
	}

	log.InfoContext(context.Background(), "plain")
	m := line()
	require.NotContains(t, m, "trace_id")
	require.NotContains(t, m, "request_id")

	ctx := telemetry.WithRequestID(context.Background(), "req-1")
	log.InfoContext(ctx, "with id")
	m = line()
	require.Equal(t, "req-1", m["request_id"])
	require.NotContains(t, m, "trace_id", "no span active")

	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}))
	log.InfoContext(ctx, "in a span", "request_id", "req-1")
	m = line()
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", m["trace_id"])
	require.Equal(t, "b7ad6b7169203331", m["span_id"])
	require.Equal(t, "test", m["component"])
	require.Equal(t, 1, strings.Count(raw, `"request_id"`), "request_id once: %s", raw)
}

// countingTracer counts the statements it sees.
type countingTracer struct{ n int }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n++
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestPgxTracerChainsAndTracesBatches(t *testing.T) {
	r, err := otlptest.Start(true)
	require.NoError(t, err)
	defer r.Close()
	clearEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.URL)
	tp, shutdown, err := telemetry.Setup(context.Background(), telemetry.Config{})
	require.NoError(t, err)
	own := &countingTracer{}
	named := func(sql string) string {
		if sql == "INSERT INTO t VALUES (1)" {
			return "insert_t"
		}
		return ""
	}
	tr := telemetry.PgxTracer(tp, own, named)
	// The start's pipeline (models/pipeline.go) shows its statements to the
	// pool's tracer as a batch: the chain must be a BatchTracer.
	bt, ok := tr.(pgx.BatchTracer)
	require.True(t, ok, "the pgx tracer is a pgx.BatchTracer")

	ctx, span := telemetry.Tracer(tp).Start(context.Background(), "request")
	qctx := tr.TraceQueryStart(ctx, nil, pgx.TraceQueryStartData{SQL: "SELECT 1"})
	tr.TraceQueryEnd(qctx, nil, pgx.TraceQueryEndData{})
	bctx := bt.TraceBatchStart(ctx, nil, pgx.TraceBatchStartData{Batch: &pgx.Batch{}})
	bt.TraceBatchQuery(bctx, nil, pgx.TraceBatchQueryData{SQL: "INSERT INTO t VALUES (1)"})
	bt.TraceBatchEnd(bctx, nil, pgx.TraceBatchEndData{})
	span.End()
	require.Equal(t, 1, own.n, "the caller's tracer still sees the statement")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, shutdown(sctx))
	names := map[string]string{}
	for _, s := range r.Spans() {
		names[s.Name] = s.TraceID
		require.NotContains(t, s.Attrs, "db.query.text", "span %q carries its statement's text", s.Name)
	}
	trace := span.SpanContext().TraceID().String()
	require.Len(t, names, 4, "%v", names) // request, the query, the batch and its statement
	require.Contains(t, names, "SELECT 1", "a statement without a name is named by its first line")
	require.Contains(t, names, "insert_t", "a named statement's span is named by it")
	for name, tid := range names {
		require.Equal(t, trace, tid, name)
	}
}

func TestStatementSpanName(t *testing.T) {
	named := func(sql string) string {
		if strings.HasPrefix(sql, "WITH input") {
			return "start_batch"
		}
		return ""
	}
	long := "SELECT " + strings.Repeat("é", 60) // 127 bytes: é is two
	for _, c := range []struct{ sql, want string }{
		{"WITH input AS (\n\tSELECT 1\n) SELECT * FROM input", "start_batch"},
		{"  SELECT id FROM runs WHERE id = $1  ", "SELECT id FROM runs WHERE id = $1"},
		{"UPDATE runs SET status = $1\nWHERE id = $2", "UPDATE runs SET status = $1"},
		{long, long[:99] + "..."}, // 100 would cut an é in two
		{"", ""},
	} {
		require.Equal(t, c.want, telemetry.StatementSpanName(c.sql, named), "%q", c.sql)
	}
	require.Equal(t, "SELECT 1", telemetry.StatementSpanName("SELECT 1", nil), "named may be nil")
}
