package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

const remote = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func env(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

// TestFromEnvOffByDefault: without an endpoint or exporter, or with
// none or OTEL_SDK_DISABLED, there is no provider.
func TestFromEnvOffByDefault(t *testing.T) {
	t.Parallel()
	for _, kv := range []map[string]string{
		{},
		{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
	} {
		p, err := fromLookup(context.Background(), env(kv))
		if err != nil || p != nil {
			t.Errorf("%v: provider %v, err %v; want off", kv, p, err)
		}
	}
}

// TestFromEnvRefusesTypos: an unknown exporter, protocol or sampler, or a
// ratio outside [0, 1], is an error naming the variable.
func TestFromEnvRefusesTypos(t *testing.T) {
	t.Parallel()
	for want, kv := range map[string]map[string]string{
		"OTEL_TRACES_EXPORTER":        {"OTEL_TRACES_EXPORTER": "jaeger"},
		"OTEL_EXPORTER_OTLP_PROTOCOL": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
		"OTEL_TRACES_SAMPLER=":        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER": "sometimes"},
		"OTEL_TRACES_SAMPLER_ARG":     {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
	} {
		p, err := fromLookup(context.Background(), env(kv))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: err %v; want one naming %s", kv, err, want)
		}
		if p != nil {
			p.Shutdown(context.Background())
		}
	}
}

// TestFromEnvExportsOverHTTPAndGRPC: with an endpoint, spans reach it over
// OTLP/HTTP (protobuf) by default; with OTEL_EXPORTER_OTLP_PROTOCOL=grpc an
// gRPC receiver gets them; sampling at 0 exports nothing. Not parallel:
// the exporters read the process environment.
func TestFromEnvExportsOverHTTPAndGRPC(t *testing.T) {
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" && r.Header.Get("Content-Type") == "application/x-protobuf" && bytes.Contains(b, []byte("exported-span")) {
			posts.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	ctx := context.Background()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	p, err := FromEnv(ctx)
	if err != nil || p == nil {
		t.Fatalf("provider %v, err %v", p, err)
	}
	_, s := p.Tracer("t").Start(ctx, "exported-span")
	s.End()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if posts.Load() != 1 {
		t.Fatalf("%d exports reached the endpoint after Shutdown; want 1", posts.Load())
	}

	t.Setenv("OTEL_TRACES_SAMPLER", "traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	p, err = FromEnv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, s = p.Tracer("t").Start(ctx, "exported-span")
	if s.IsRecording() || s.SpanContext().IsSampled() {
		t.Fatal("a span sampled at ratio 0 records")
	}
	s.End()
	p.Shutdown(ctx)
	if posts.Load() != 1 {
		t.Fatalf("sampling at 0 exported a span")
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	gr := &grpcReceiver{}
	coltrace.RegisterTraceServiceServer(gs, gr)
	go gs.Serve(ln)
	defer gs.Stop()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	g, err := FromEnv(ctx)
	if err != nil || g == nil {
		t.Fatalf("grpc: provider %v, err %v", g, err)
	}
	_, s = g.Tracer("t").Start(ctx, "exported-span")
	s.End()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if gr.spans.Load() != 1 {
		t.Fatalf("the gRPC receiver got %d spans; want 1", gr.spans.Load())
	}
}

type grpcReceiver struct {
	coltrace.UnimplementedTraceServiceServer
	spans atomic.Int32
}

func (g *grpcReceiver) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			g.spans.Add(int32(len(ss.Spans)))
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// TestInjectKeepsCallerHeaders: a traceparent the caller set wins; without
// a valid span nothing is added.
func TestInjectKeepsCallerHeaders(t *testing.T) {
	t.Parallel()
	ctx := WithTraceparent(context.Background(), remote, "k=v")
	h := Inject(ctx, nil)
	if h["traceparent"] != remote || h["tracestate"] != "k=v" {
		t.Fatalf("Inject = %v", h)
	}
	mine := map[string]string{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}
	if Inject(ctx, mine)["traceparent"] != mine["traceparent"] {
		t.Fatal("Inject overwrote the caller's traceparent")
	}
	if h := Inject(context.Background(), nil); h != nil {
		t.Fatalf("Inject without a span = %v", h)
	}
	if got := trace.SpanContextFromContext(FromHeaders(context.Background(), json.RawMessage(`{"traceparent":"`+remote+`"}`))); got.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || !got.IsRemote() {
		t.Fatalf("FromHeaders = %v", got)
	}
	if FromHeaders(context.Background(), json.RawMessage(`{"traceparent":"garbage"}`)) != context.Background() {
		t.Fatal("FromHeaders accepted an invalid traceparent")
	}
	out := ReplaceInHeaders(ctx, json.RawMessage(`{"a":"b","traceparent":"old","tracestate":"old=1"}`))
	var m map[string]string
	json.Unmarshal(out, &m)
	if m["a"] != "b" || m["traceparent"] != remote || m["tracestate"] != "k=v" {
		t.Fatalf("ReplaceInHeaders = %s", out)
	}
}

// TestLogHandlerAddsIDs: a line logged with a traced context carries
// trace_id and span_id; one without does not.
func TestLogHandlerAddsIDs(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "x")
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ctx, span := tp.Tracer("t").Start(context.Background(), "op")
	log.InfoContext(ctx, "traced")
	span.End()
	log.Info("untraced")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var first, second map[string]any
	json.Unmarshal([]byte(lines[0]), &first)
	json.Unmarshal([]byte(lines[1]), &second)
	if first["trace_id"] != span.SpanContext().TraceID().String() || first["span_id"] != span.SpanContext().SpanID().String() || first["component"] != "x" {
		t.Fatalf("traced line %s", lines[0])
	}
	if _, ok := second["trace_id"]; ok {
		t.Fatalf("untraced line %s", lines[1])
	}
}

// TestNoopProviderIsOff: a no-op provider (or none) gives no tracer, and
// the step helpers then allocate nothing.
func TestNoopProviderIsOff(t *testing.T) {
	if Tracer(nil) != nil || Tracer(noop.NewTracerProvider()) != nil {
		t.Fatal("a no-op provider gave a tracer")
	}
	tr := Tracer(noop.NewTracerProvider())
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() {
		c, s := Step(ctx, tr, remote, "order", 1, [16]byte{1}, "charge", 0, 1, false)
		EndStep(s, "completed", true, nil)
		_ = c
	}); n != 0 {
		t.Fatalf("step tracing with the no-op provider allocates %v times per step; want 0", n)
	}
}

func BenchmarkStepNoop(b *testing.B) {
	tr := Tracer(noop.NewTracerProvider())
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, s := Step(ctx, tr, remote, "order", 1, [16]byte{1}, "charge", 0, 1, false)
		EndStep(s, "completed", true, nil)
	}
}

func BenchmarkStepSampledOut(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.TraceIDRatioBased(0)))
	tr := Tracer(tp)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, s := Step(ctx, tr, "", "order", 1, [16]byte{1}, "charge", 0, 1, false)
		EndStep(s, "completed", true, nil)
	}
}
