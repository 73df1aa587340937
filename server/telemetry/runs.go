package telemetry

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/snapcoord/snapcoord/server/engine"

	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// Per-run gauges, labelled run_id. They are observed at each scrape from the
// runs LiveView.Runs lists: those running and those ended within
// --run-metrics-retention (engine.MetricRuns). A run's series disappear
// after that, and a queued PENDING run has none: the label's cardinality is
// bounded by the jobs running and the runs ended recently, not by
// --max-runs or history.
const (
	MetricRunState           = "snapcoord.run.state"
	MetricRunUntilMustSaveBy = "snapcoord.run.until_must_save_by"
	MetricRunUntilFiresAt    = "snapcoord.run.until_fires_at"
	MetricRunDecisionSpare   = "snapcoord.run.decision.spare"
	MetricRunIteration       = "snapcoord.run.iteration"
	MetricRunCheckpoint      = "snapcoord.run.checkpoint"
	MetricRunSaveReserve     = "snapcoord.run.save_reserve"
	MetricRunMargin          = "snapcoord.run.margin"
	MetricRunSnapshotFails   = "snapcoord.run.snapshot.failures_in_a_row"
	MetricHealthServing      = "snapcoord.health.serving"
	MetricLeader             = "snapcoord.leader"
	MetricStoreCommitFailed  = "snapcoord.store.commit.failed"
)

// runGauges are the per-run and health gauges.
type runGauges struct {
	state, snapshotFails                   metric.Int64ObservableGauge
	untilB, untilFires, spare              metric.Float64ObservableGauge
	iteration, checkpoint, reserve, margin metric.Float64ObservableGauge
	serving, commitFailed, leader          metric.Int64ObservableGauge
}

func newRunGauges(meter metric.Meter) (*runGauges, error) {
	g := &runGauges{}
	var errs []error
	f := func(name, desc string) metric.Float64ObservableGauge {
		o, err := meter.Float64ObservableGauge(name, metric.WithUnit("s"), metric.WithDescription(desc))
		errs = append(errs, err)
		return o
	}
	i := func(name, unit, desc string) metric.Int64ObservableGauge {
		o, err := meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return o
	}
	g.state = i(MetricRunState, "", "1 for each run with per-run series (running, or ended within --run-metrics-retention), labelled with its state.")
	g.snapshotFails = i(MetricRunSnapshotFails, "{snapshot}", "IO_ERROR and TIMEOUT snapshots since the run's last SAVED one, as max_consecutive_failures counts them.")
	g.untilB = f(MetricRunUntilMustSaveBy, "Seconds until the run's deadline B (must_save_by); negative once it passed.")
	g.untilFires = f(MetricRunUntilFiresAt, "Seconds until fires_at = B - (I + C + R + M), from which a completed step saves and stops.")
	g.spare = f(MetricRunDecisionSpare, "Spare time the latest step decision left: B - (decided_at + I + C + R + M) with its inputs.")
	g.iteration = f(MetricRunIteration, "The run's current I: the longest iteration so far.")
	g.checkpoint = f(MetricRunCheckpoint, "The run's current C: the longest trainer checkpoint save so far (or the prior).")
	g.reserve = f(MetricRunSaveReserve, "The run's current R: the environment snapshot reserve.")
	g.margin = f(MetricRunMargin, "The run's M: the safety margin.")
	g.serving = i(MetricHealthServing, "", "1 while gRPC health reports SERVING, 0 otherwise.")
	g.commitFailed = i(MetricStoreCommitFailed, "", "1 once a store commit has failed: the coordinator refuses changes until restarted.")
	g.leader = i(MetricLeader, "", "1 while this coordinator serves RunService and WorkerService: always on bbolt, while it leads its group on etcd.")
	for _, e := range errs {
		if e != nil {
			return nil, e
		}
	}
	return g, nil
}

// LiveView is what the per-run and health gauges read at each scrape.
type LiveView struct {
	Runs         func() []engine.LiveRun // the runs with per-run series
	Serving      func() bool
	Leading      func() bool
	CommitFailed func() bool
	Now          func() time.Time
}

// ObserveLive registers the per-run and health gauges, read from v at each
// scrape. Call it once, when the engine and the gRPC server exist.
func (t *Telemetry) ObserveLive(v LiveView) error {
	meter := t.metrics.provider.Meter(scope)
	g, err := newRunGauges(meter)
	if err != nil {
		return fmt.Errorf("telemetry: per-run gauges: %w", err)
	}
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(g.serving, boolGauge(v.Serving()))
		o.ObserveInt64(g.commitFailed, boolGauge(v.CommitFailed()))
		o.ObserveInt64(g.leader, boolGauge(v.Leading()))
		now := v.Now()
		for _, lr := range v.Runs() {
			g.observeRun(o, now, lr)
		}
		return nil
	}, g.state, g.snapshotFails, g.untilB, g.untilFires, g.spare, g.iteration, g.checkpoint, g.reserve, g.margin, g.serving, g.commitFailed, g.leader)
	if err != nil {
		return fmt.Errorf("telemetry: per-run gauges: %w", err)
	}
	t.liveReg = reg
	return nil
}

func (g *runGauges) observeRun(o metric.Observer, now time.Time, lr engine.LiveRun) {
	run := lr.Run
	id := metric.WithAttributes(attribute.String("run_id", run.GetRunId()))
	o.ObserveInt64(g.state, 1, metric.WithAttributes(attribute.String("run_id", run.GetRunId()), attribute.String("state", apifacts.EnumLower(run.GetState()))))
	o.ObserveInt64(g.snapshotFails, int64(lr.SnapshotFailuresInARow), id)
	d := run.GetDeadline()
	o.ObserveFloat64(g.iteration, d.GetIterationSeconds(), id)
	o.ObserveFloat64(g.checkpoint, d.GetCheckpointSeconds(), id)
	o.ObserveFloat64(g.reserve, d.GetSaveReserveSeconds(), id)
	o.ObserveFloat64(g.margin, d.GetMarginSeconds(), id)
	if d.GetMustSaveBy() != nil {
		o.ObserveFloat64(g.untilB, d.GetMustSaveBy().AsTime().Sub(now).Seconds(), id)
	}
	if d.GetFiresAt() != nil {
		o.ObserveFloat64(g.untilFires, d.GetFiresAt().AsTime().Sub(now).Seconds(), id)
	}
	if in := lr.LastDecision.GetInputs(); in.GetMustSaveBy() != nil {
		need := in.GetIterationSeconds() + in.GetCheckpointSeconds() + in.GetSaveReserveSeconds() + in.GetMarginSeconds()
		spare := in.GetMustSaveBy().AsTime().Sub(lr.LastDecision.GetDecidedAt().AsTime()).Seconds() - need
		o.ObserveFloat64(g.spare, spare, id)
	}
}

func boolGauge(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
