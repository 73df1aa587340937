package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
	"github.com/snapcoord/snapcoord/server/engine"
)

// Instrument names, in OpenTelemetry form. The Prometheus exporter turns
// dots into underscores and adds the unit and _total suffixes, so
// snapcoord.decisions is scraped as snapcoord_decisions_total and
// snapcoord.store.commit.duration as snapcoord_store_commit_duration_seconds.
const (
	MetricRuns                = "snapcoord.runs"
	MetricWorkers             = "snapcoord.workers"
	MetricCommandsIssued      = "snapcoord.commands.issued"
	MetricCommandDelivery     = "snapcoord.command.delivery.duration"
	MetricSnapshotDuration    = "snapcoord.snapshot.duration"
	MetricDecisions           = "snapcoord.decisions"
	MetricDeadlineFires       = "snapcoord.deadline.fires"
	MetricDeadlineMissed      = "snapcoord.deadline.missed"
	MetricStoreCommitDuration = "snapcoord.store.commit.duration"
	MetricStoreCommitBatches  = "snapcoord.store.commit.batches"
	MetricCheckpointDuration  = "snapcoord.checkpoint.duration"

	MetricCredentialsReloadFailures = "snapcoord.credentials.reload.failures"
	MetricCredentialsReloadFailed   = "snapcoord.credentials.reload.failed"
	MetricTLSCertificateExpiry      = "snapcoord.tls.certificate.expiry.timestamp"
)

// Bucket boundaries, in seconds (batches for the last). Commands wait for
// a stream or a poll, snapshots take up to snapshot_timeout_s (600 s by
// default), a commit is two fsyncs.
var (
	deliveryBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300}
	snapshotBuckets = []float64{0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1200, 3600}
	commitBuckets   = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
	batchBuckets    = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096}
)

// metrics owns the meter provider, its Prometheus registry and the
// snapcoord instruments.
type metrics struct {
	provider *sdkmetric.MeterProvider
	registry *prometheus.Registry

	commandsIssued   metric.Int64Counter
	commandDelivery  metric.Float64Histogram
	snapshotDuration metric.Float64Histogram
	checkpointDur    metric.Float64Histogram
	decisions        metric.Int64Counter
	deadlineFires    metric.Int64Counter
	deadlineMissed   metric.Int64Counter
	commitDuration   metric.Float64Histogram
	commitBatches    metric.Int64Histogram

	reloadFailures metric.Int64Counter
	reloadFailed   metric.Int64Gauge
	certExpiry     metric.Float64Gauge

	runs    metric.Int64ObservableGauge
	workers metric.Int64ObservableGauge

	attrs attrSets
}

func newMetrics(res *resource.Resource) (*metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		// otel_scope_* labels on every series say only that snapcoord or
		// otelgrpc made it, which the metric names already tell.
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	m := &metrics{
		provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res)),
		registry: reg,
	}
	meter := m.provider.Meter(scope)
	if err := errors.Join(m.instruments(meter), m.credentialInstruments(meter)); err != nil {
		_ = m.provider.Shutdown(context.Background())
		return nil, fmt.Errorf("telemetry: create instruments: %w", err)
	}
	m.startAtZero()
	return m, nil
}

// startAtZero makes the series that alerts read exist from the start, at
// 0: Prometheus sees no increase in a series whose first sample is already
// 1, so the first missed deadline after each start would never alert.
func (m *metrics) startAtZero() {
	ctx := context.Background()
	for _, cause := range engine.MissCauses() {
		m.deadlineMissed.Add(ctx, 0, m.attrs.get(attrKey{k1: "cause", v1: string(cause)}))
	}
	for _, what := range []string{CredentialsAdminTokens, CredentialsTLS} {
		attrs := m.attrs.get(attrKey{k1: "credentials", v1: what})
		m.reloadFailures.Add(ctx, 0, attrs)
		m.reloadFailed.Record(ctx, 0, attrs)
	}
}

func (m *metrics) instruments(meter metric.Meter) error {
	var err error
	try := func(e error) {
		if err == nil {
			err = e
		}
	}
	var e error
	m.commandsIssued, e = meter.Int64Counter(MetricCommandsIssued, metric.WithUnit("{command}"),
		metric.WithDescription("Commands appended to a run's command log, by kind."))
	try(e)
	m.commandDelivery, e = meter.Float64Histogram(MetricCommandDelivery, metric.WithUnit("s"),
		metric.WithDescription("Time from a command's issue to its sending on a stream or return by a poll, by kind."),
		metric.WithExplicitBucketBoundaries(deliveryBuckets...))
	try(e)
	m.snapshotDuration, e = meter.Float64Histogram(MetricSnapshotDuration, metric.WithUnit("s"),
		metric.WithDescription("Environment snapshot duration (issue to last report), by reason and outcome."),
		metric.WithExplicitBucketBoundaries(snapshotBuckets...))
	try(e)
	m.checkpointDur, e = meter.Float64Histogram(MetricCheckpointDuration, metric.WithUnit("s"),
		metric.WithDescription("Trainer checkpoint save, the slowest rank's, once every rank saved the step."),
		metric.WithExplicitBucketBoundaries(snapshotBuckets...))
	try(e)
	m.decisions, e = meter.Int64Counter(MetricDecisions, metric.WithUnit("{decision}"),
		metric.WithDescription("Step decisions made (once per run and step), by action."))
	try(e)
	m.deadlineFires, e = meter.Int64Counter(MetricDeadlineFires, metric.WithUnit("{fire}"),
		metric.WithDescription("Deadlines fired, by kind (step, pre_step, manual)."))
	try(e)
	m.deadlineMissed, e = meter.Int64Counter(MetricDeadlineMissed, metric.WithUnit("{run}"),
		metric.WithDescription("Runs that missed their deadline (once per run), by cause: decided_after_deadline, running_at_deadline, saving_at_deadline, save_ended_after_deadline."))
	try(e)
	m.commitDuration, e = meter.Float64Histogram(MetricStoreCommitDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of one bbolt group commit, fsyncs included."),
		metric.WithExplicitBucketBoundaries(commitBuckets...))
	try(e)
	m.commitBatches, e = meter.Int64Histogram(MetricStoreCommitBatches, metric.WithUnit("{batch}"),
		metric.WithDescription("Batches (mutations) carried by one group commit."),
		metric.WithExplicitBucketBoundaries(batchBuckets...))
	try(e)
	m.runs, e = meter.Int64ObservableGauge(MetricRuns, metric.WithUnit("{run}"),
		metric.WithDescription("Runs known to the coordinator, by state."))
	try(e)
	m.workers, e = meter.Int64ObservableGauge(MetricWorkers, metric.WithUnit("{worker}"),
		metric.WithDescription("Workers of all runs, by role and state."))
	try(e)
	return err
}

func (m *metrics) credentialInstruments(meter metric.Meter) error {
	var errs [3]error
	m.reloadFailures, errs[0] = meter.Int64Counter(MetricCredentialsReloadFailures, metric.WithUnit("{reload}"),
		metric.WithDescription("Reloads of the admin token file or the TLS files that failed (the credentials in use stayed), by credentials: admin_tokens, tls."))
	m.reloadFailed, errs[1] = meter.Int64Gauge(MetricCredentialsReloadFailed,
		metric.WithDescription("1 while the latest reload of these credentials failed: the files on disk are not the ones in use."))
	m.certExpiry, errs[2] = meter.Float64Gauge(MetricTLSCertificateExpiry, metric.WithUnit("s"),
		metric.WithDescription("When a certificate in use expires (Unix seconds): the earliest NotAfter of the --tls-cert chain (certificate=server) or of the --client-ca file (certificate=client_ca)."))
	return errors.Join(errs[:]...)
}

// observeStats registers the gauges' callback. Every state is reported,
// zeros included, so a dashboard's series do not vanish when a count drops
// to zero.
func (m *metrics) observeStats(stats func() engine.Stats) (metric.Registration, error) {
	meter := m.provider.Meter(scope)
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		for _, st := range enumValues(v1.RunState_name) {
			state := v1.RunState(st)
			o.ObserveInt64(m.runs, int64(s.Runs[state]), metric.WithAttributes(attribute.String("state", apifacts.EnumLower(state))))
		}
		for _, ro := range enumValues(v1.WorkerRole_name) {
			role := v1.WorkerRole(ro)
			for _, ws := range enumValues(v1.WorkerState_name) {
				state := v1.WorkerState(ws)
				o.ObserveInt64(m.workers, int64(s.Workers[role][state]), metric.WithAttributes(
					attribute.String("role", apifacts.EnumLower(role)),
					attribute.String("state", apifacts.EnumLower(state))))
			}
		}
		return nil
	}, m.runs, m.workers)
}

// enumValues lists an enum's values but UNSPECIFIED (0).
func enumValues(names map[int32]string) []int32 {
	var vals []int32
	for v := range names {
		if v != 0 {
			vals = append(vals, v)
		}
	}
	return vals
}

// attrKey names a measurement's attributes: one or two, by key and value.
type attrKey struct{ k1, v1, k2, v2 string }

// attrSets remembers each measurement's attribute set. The values come from
// small enums, and building a set on every call (a sort and a hash, in a
// 3.5 KiB stack frame) cost CPU on every command delivered and grew every
// command stream's goroutine stack from 8 KiB to 16 KiB.
type attrSets struct {
	mu   sync.RWMutex
	sets map[attrKey]metric.MeasurementOption
}

func (c *attrSets) get(k attrKey) metric.MeasurementOption {
	c.mu.RLock()
	o, ok := c.sets[k]
	c.mu.RUnlock()
	if !ok {
		o = c.add(k)
	}
	return o
}

func (c *attrSets) add(k attrKey) metric.MeasurementOption {
	kv := []attribute.KeyValue{attribute.String(k.k1, k.v1)}
	if k.k2 != "" {
		kv = append(kv, attribute.String(k.k2, k.v2))
	}
	o := metric.WithAttributeSet(attribute.NewSet(kv...))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sets == nil {
		c.sets = make(map[attrKey]metric.MeasurementOption)
	}
	c.sets[k] = o
	return o
}

func (m *metrics) decision(a v1.StepAction) {
	m.decisions.Add(context.Background(), 1, m.attrs.get(attrKey{k1: "action", v1: apifacts.EnumLower(a)}))
}

func (m *metrics) deadlineFired(k v1.DeadlineFireKind) {
	m.deadlineFires.Add(context.Background(), 1, m.attrs.get(attrKey{k1: "kind", v1: apifacts.EnumLower(k)}))
}

func (m *metrics) deadlineMissedBy(cause engine.MissCause) {
	m.deadlineMissed.Add(context.Background(), 1, m.attrs.get(attrKey{k1: "cause", v1: string(cause)}))
}

func (m *metrics) commandIssued(kind string) {
	m.commandsIssued.Add(context.Background(), 1, m.attrs.get(attrKey{k1: "kind", v1: kind}))
}

func (m *metrics) commandDelivered(kind string, latency time.Duration) {
	m.commandDelivery.Record(context.Background(), max(latency.Seconds(), 0), m.attrs.get(attrKey{k1: "kind", v1: kind}))
}

func (m *metrics) snapshotCompleted(reason v1.SnapshotReason, outcome v1.SnapshotOutcome, seconds float64) {
	m.snapshotDuration.Record(context.Background(), seconds, m.attrs.get(attrKey{
		k1: "reason", v1: apifacts.EnumLower(reason),
		k2: "outcome", v2: apifacts.EnumLower(outcome)}))
}

func (m *metrics) checkpointSaved(seconds float64) {
	m.checkpointDur.Record(context.Background(), seconds)
}

func (m *metrics) committed(batches int, d time.Duration) {
	ctx := context.Background()
	m.commitDuration.Record(ctx, d.Seconds())
	m.commitBatches.Record(ctx, int64(batches))
}

func (m *metrics) credentialsReloaded(what string, err error) {
	ctx := context.Background()
	attrs := m.attrs.get(attrKey{k1: "credentials", v1: what})
	if err != nil {
		m.reloadFailures.Add(ctx, 1, attrs)
	}
	m.reloadFailed.Record(ctx, boolGauge(err != nil), attrs)
}

func (m *metrics) certificateExpiry(which string, notAfter time.Time) {
	m.certExpiry.Record(context.Background(), float64(notAfter.Unix()), m.attrs.get(attrKey{k1: "certificate", v1: which}))
}
