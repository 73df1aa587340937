// Package telemetry is snapcoord's operational view of itself: one log line
// per RPC, OpenTelemetry traces (exported over OTLP when the standard
// OTEL_EXPORTER_OTLP_* variables ask for it) and OpenTelemetry metrics
// exposed for Prometheus on /metrics.
//
// The engine knows nothing of this package: it reports through its
// engine.Observer and engine.Stats, the store through its OnCommit hook, and
// gRPC through the otelgrpc stats handler.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/stats"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/engine"
)

// scope is the instrumentation scope of snapcoord's own spans and metrics.
const scope = "github.com/snapcoord/snapcoord/server"

// Options configure Telemetry.
type Options struct {
	// Logger receives warnings about the telemetry setup itself.
	Logger *slog.Logger
	// ServiceVersion is the service.version resource attribute.
	ServiceVersion string
	// LookupEnv reads the OTEL_* variables; default os.LookupEnv. The OTLP
	// exporter reads its own settings (endpoint, headers, TLS) from the
	// process environment as the OpenTelemetry specification describes.
	LookupEnv func(string) (string, bool)
}

// Telemetry holds the meter and tracer providers. It implements
// engine.Observer; OnCommit is the store's commit hook.
type Telemetry struct {
	log     *slog.Logger
	metrics *metrics
	tracing *tracing
	stats   stats.Handler

	statsReg metric.Registration
	liveReg  metric.Registration
}

var _ engine.Observer = (*Telemetry)(nil)

// New sets up metrics (always) and traces (exported only when configured).
func New(ctx context.Context, opts Options) (*Telemetry, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	res, err := newResource(ctx, opts.ServiceVersion)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(res)
	if err != nil {
		return nil, err
	}
	tr, err := newTracing(ctx, res, opts)
	if err != nil {
		_ = m.provider.Shutdown(ctx)
		return nil, err
	}
	t := &Telemetry{log: opts.Logger, metrics: m, tracing: tr}
	if !tr.exported {
		if t.stats, err = newRPCMetrics(m.provider.Meter(scope)); err != nil {
			_ = m.provider.Shutdown(ctx)
			return nil, fmt.Errorf("telemetry: create RPC metrics: %w", err)
		}
		return t, nil
	}
	t.stats = rpcSpans{otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(tr.provider),
		otelgrpc.WithMeterProvider(m.provider),
		// Honour a caller's W3C trace context, so a trainer's span can be
		// the parent of the coordinator's.
		otelgrpc.WithPropagators(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
	)}
	return t, nil
}

func newResource(ctx context.Context, version string) (*resource.Resource, error) {
	kv := []attribute.KeyValue{attribute.String("service.name", "snapcoord")}
	if version != "" {
		kv = append(kv, attribute.String("service.version", version))
	}
	// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME come last and win.
	res, err := resource.New(ctx, resource.WithAttributes(kv...), resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv())
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	// A partial resource (say, an unparsable OTEL_RESOURCE_ATTRIBUTES
	// entry) is still better than none.
	return res, nil
}

// StatsHandler records the rpc.server.call.duration metric of every RPC
// and, when traces are exported, is otelgrpc's server handler, with a span
// per RPC that names the request's run and worker. Install it with
// grpc.StatsHandler.
func (t *Telemetry) StatsHandler() stats.Handler { return t.stats }

// TracesExported reports whether spans leave the process.
func (t *Telemetry) TracesExported() bool { return t.tracing.exported }

// ObserveEngine feeds the runs and workers gauges from stats, read at each
// scrape. Call it once the engine exists.
func (t *Telemetry) ObserveEngine(stats func() engine.Stats) error {
	reg, err := t.metrics.observeStats(stats)
	if err != nil {
		return fmt.Errorf("telemetry: register gauges: %w", err)
	}
	t.statsReg = reg
	return nil
}

// Handler serves /metrics and, when withPprof is set, /debug/pprof/.
func (t *Telemetry) Handler(withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(t.metrics.registry, promhttp.HandlerOpts{
		ErrorLog: scrapeErrorLog{t.log},
	}))
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Shutdown flushes pending spans and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, reg := range []metric.Registration{t.statsReg, t.liveReg} {
		if reg != nil {
			errs = append(errs, reg.Unregister())
		}
	}
	errs = append(errs, t.tracing.shutdown(ctx), t.metrics.provider.Shutdown(ctx))
	return errors.Join(errs...)
}

// OnCommit is store.Options.OnCommit: the commit latency histogram and a
// "store.commit" span covering the commit.
func (t *Telemetry) OnCommit(batches int, d time.Duration) {
	t.metrics.committed(batches, d)
	// A group commit serves many calls at once: its span is a root.
	t.tracing.interval(context.Background(), "store.commit", d, attribute.Int("snapcoord.store.batches", batches))
}

// Decision implements engine.Observer: a "deadline.decision" span, a child
// of the CompleteStep call that made it.
func (t *Telemetry) Decision(ctx context.Context, runID string, step int64, action v1.StepAction) {
	t.metrics.decision(action)
	t.tracing.interval(ctx, "deadline.decision", 0, attribute.String(AttrRunID, runID), attribute.Int64(AttrStep, step),
		attribute.String("snapcoord.action", action.String()))
}

// DeadlineFired implements engine.Observer.
func (t *Telemetry) DeadlineFired(ctx context.Context, runID string, step int64, kind v1.DeadlineFireKind) {
	t.metrics.deadlineFired(kind)
	t.tracing.interval(ctx, "deadline.fire", 0, attribute.String(AttrRunID, runID), attribute.Int64(AttrStep, step),
		attribute.String("snapcoord.fire_kind", kind.String()))
}

// DeadlineMissed implements engine.Observer: the counter, and a
// "deadline.missed" span.
func (t *Telemetry) DeadlineMissed(ctx context.Context, runID string, cause engine.MissCause) {
	t.metrics.deadlineMissedBy(cause)
	t.tracing.interval(ctx, "deadline.missed", 0, attribute.String(AttrRunID, runID), attribute.String("snapcoord.miss_cause", string(cause)))
}

// CommandIssued implements engine.Observer.
func (t *Telemetry) CommandIssued(_ context.Context, kind string) { t.metrics.commandIssued(kind) }

// CommandDelivered implements engine.Observer.
func (t *Telemetry) CommandDelivered(_ context.Context, kind string, latency time.Duration) {
	t.metrics.commandDelivered(kind, latency)
}

// SnapshotCompleted implements engine.Observer.
func (t *Telemetry) SnapshotCompleted(ctx context.Context, runID, snapshotID string, reason v1.SnapshotReason, outcome v1.SnapshotOutcome, seconds float64) {
	t.metrics.snapshotCompleted(reason, outcome, seconds)
	t.tracing.interval(ctx, "snapshot", time.Duration(seconds*float64(time.Second)),
		attribute.String(AttrRunID, runID), attribute.String(AttrSnapshotID, snapshotID),
		attribute.String("snapcoord.snapshot_reason", reason.String()),
		attribute.String("snapcoord.snapshot_outcome", outcome.String()))
}

// CheckpointSaved implements engine.Observer.
func (t *Telemetry) CheckpointSaved(_ context.Context, _ string, _ int64, seconds float64) {
	t.metrics.checkpointSaved(seconds)
}

// The credentials a reload covers: the label credentials of the reload
// metrics.
const (
	CredentialsAdminTokens = "admin_tokens" // --admin-token-file
	CredentialsTLS         = "tls"          // --tls-cert, --tls-key and --client-ca
)

// The certificates whose expiry is a metric: the label certificate.
const (
	CertificateServer   = "server"    // the --tls-cert chain
	CertificateClientCA = "client_ca" // the CAs in --client-ca
)

// CredentialsReloaded records a reload of what (CredentialsAdminTokens or
// CredentialsTLS): a failure counts, and the failed gauge says whether the
// latest attempt failed.
func (t *Telemetry) CredentialsReloaded(what string, err error) {
	t.metrics.credentialsReloaded(what, err)
}

// CertificateExpiry records when a certificate in use (CertificateServer
// or CertificateClientCA) expires; call it at each load.
func (t *Telemetry) CertificateExpiry(which string, notAfter time.Time) {
	t.metrics.certificateExpiry(which, notAfter)
}

// Tracer returns snapcoord's tracer, for spans of its own.
func (t *Telemetry) Tracer() trace.Tracer { return t.tracing.tracer }
