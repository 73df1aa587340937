package coordinator_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/metadata"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordtest"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/server/coordinator"
)

// perRunSeries scrapes /metrics and counts the snapcoord_run_* series by
// run_id.
func perRunSeries(t *testing.T, metricsAddr string) map[string]int {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	byRun := map[string]int{}
	for name, fam := range fams {
		if !strings.HasPrefix(name, "snapcoord_run_") {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "run_id" {
					byRun[lp.GetValue()]++
				}
			}
		}
	}
	return byRun
}

func runIDs(byRun map[string]int) []string {
	var ids []string
	for id := range byRun {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Per-run series exist only for runs that are running (RUNNING, SAVING,
// SNAPSHOTTING, or PENDING with a live worker) or ended within
// --run-metrics-retention: hundreds of queued PENDING runs and runs ended
// long ago add none, so the series are bounded by the jobs running, not by
// --max-runs. The engine's fake clock ends the retention.
func TestPerRunSeriesStayBounded(t *testing.T) {
	clk := clock.NewFake(time.Now())
	cfg := coordtest.Config(t.TempDir())
	cfg.MetricsListen = "127.0.0.1:0"
	cfg.RunMetricsRetention = 10 * time.Minute
	c := coordtest.Start(t, cfg, coordinator.WithClock(clk))
	conn := dial(t, c.Addr())
	runs, workers := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
	create := func(id string) (token string) {
		t.Helper()
		resp, err := runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: id, Spec: spectest.Checkpointed(1, "00:02:00:00")})
		if err != nil {
			t.Fatalf("CreateRun(%s): %v", id, err)
		}
		return resp.GetRunToken()
	}
	cancel := func(id string) {
		t.Helper()
		if _, err := runs.CancelRun(t.Context(), &v1.CancelRunRequest{RunId: id}); err != nil {
			t.Fatalf("CancelRun(%s): %v", id, err)
		}
	}
	register := func(id, token string, role v1.WorkerRole) (asRun context.Context, workerID string) {
		t.Helper()
		asRun = metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token)
		w, err := workers.RegisterWorker(asRun, &v1.RegisterWorkerRequest{RunId: id, Role: role, Name: "w-0"})
		if err != nil {
			t.Fatalf("RegisterWorker(%s): %v", id, err)
		}
		return asRun, w.GetWorkerId()
	}

	// Runs that ended longer than the retention ago.
	for i := range 40 {
		id := fmt.Sprintf("ended-long-ago-%d", i)
		create(id)
		cancel(id)
	}
	clk.Advance(11 * time.Minute)

	// A job starting (a live worker, no step yet), one running, one just
	// ended: these have series.
	_, _ = register("starting", create("starting"), v1.WorkerRole_WORKER_ROLE_ENVIRONMENT)
	asRun, rank := register("running", create("running"), v1.WorkerRole_WORKER_ROLE_TRAINER)
	if _, err := workers.CompleteStep(asRun, &v1.CompleteStepRequest{RunId: "running", WorkerId: rank, Step: 1, IterationSeconds: 5}); err != nil {
		t.Fatalf("CompleteStep: %v", err)
	}
	create("just-ended")
	cancel("just-ended")
	before := perRunSeries(t, c.MetricsAddr())
	if got, want := runIDs(before), []string{"just-ended", "running", "starting"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("runs with series = %v, want %v", got, want)
	}

	// Hundreds of queued PENDING runs, nothing running for them yet.
	for i := range 300 {
		create(fmt.Sprintf("queued-%d", i))
	}
	after := perRunSeries(t, c.MetricsAddr())
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("per-run series by run after 300 queued runs = %v, want as before them: %v", after, before)
	}

	// Past the retention the ended run's series go too. (The starting
	// job's worker missed its lease by then: LOST, its run no longer counts
	// as running.)
	clk.Advance(11 * time.Minute)
	if got, want := runIDs(perRunSeries(t, c.MetricsAddr())), []string{"running"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("runs with series 11 minutes on = %v, want %v", got, want)
	}
}
