package telemetry

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/stats"
)

// Span attributes that say what a span is about. Metrics never carry them:
// runs, steps and snapshots are too many to be labels.
const (
	AttrRunID      = "snapcoord.run_id"
	AttrWorkerID   = "snapcoord.worker_id"
	AttrStep       = "snapcoord.step"
	AttrSnapshotID = "snapcoord.snapshot_id"
)

// tracing is the tracer provider: the SDK with an OTLP/gRPC exporter when
// an OTLP endpoint is configured, a no-op provider otherwise (spans then
// cost next to nothing and go nowhere).
type tracing struct {
	provider trace.TracerProvider
	tracer   trace.Tracer
	exported bool
	shutdown func(context.Context) error
}

func newTracing(ctx context.Context, res *resource.Resource, opts Options) (*tracing, error) {
	lookup := opts.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if !otlpConfigured(lookup) {
		p := noop.NewTracerProvider()
		return &tracing{provider: p, tracer: p.Tracer(scope), shutdown: func(context.Context) error { return nil }}, nil
	}
	if proto := firstSet(lookup, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); proto != "" && proto != "grpc" {
		opts.Logger.Warn("only the grpc OTLP protocol is supported; exporting traces with grpc", "requested_protocol", proto)
	}
	// The exporter reads the endpoint, headers, TLS and timeout settings
	// from the OTEL_EXPORTER_OTLP_* variables itself. It connects lazily.
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP trace exporter: %w", err)
	}
	// The sampler honours OTEL_TRACES_SAMPLER; the default samples every
	// root span and follows the caller's decision otherwise.
	p := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &tracing{provider: p, tracer: p.Tracer(scope), exported: true, shutdown: p.Shutdown}, nil
}

// otlpConfigured: an endpoint is set and OTEL_TRACES_EXPORTER does not say
// "none".
func otlpConfigured(lookup func(string) (string, bool)) bool {
	if exp, _ := lookup("OTEL_TRACES_EXPORTER"); strings.TrimSpace(exp) == "none" {
		return false
	}
	return firstSet(lookup, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

func firstSet(lookup func(string) (string, bool), names ...string) string {
	for _, n := range names {
		if v, ok := lookup(n); ok && strings.TrimSpace(v) != "" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// interval records a span that ended now and lasted d, as a child of the
// span in ctx (the RPC that caused it), or a root for a timer's happening.
func (t *tracing) interval(ctx context.Context, name string, d time.Duration, kv ...attribute.KeyValue) {
	if !t.exported {
		return
	}
	end := time.Now()
	_, span := t.tracer.Start(ctx, name,
		trace.WithTimestamp(end.Add(-d)), trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(kv...))
	span.End(trace.WithTimestamp(end))
}

// rpcSpans is otelgrpc's server handler that also names, on each RPC's span,
// the run and worker its request is about, so that an operator can find a
// run's calls in a trace store.
type rpcSpans struct{ stats.Handler }

func (h rpcSpans) HandleRPC(ctx context.Context, s stats.RPCStats) {
	h.Handler.HandleRPC(ctx, s)
	in, ok := s.(*stats.InPayload)
	if !ok || in.Client {
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	f := requestFields(in.Payload)
	for i := 0; i+1 < len(f); i += 2 {
		key, _ := f[i].(string)
		val, _ := f[i+1].(string)
		span.SetAttributes(attribute.String(spanKeys[key], val))
	}
}

// spanKeys maps the log fields of a request's ids to span attributes.
var spanKeys = map[string]string{FieldRunID: AttrRunID, FieldWorkerID: AttrWorkerID}
