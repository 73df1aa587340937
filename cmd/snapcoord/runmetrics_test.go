package main

import (
	"math"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// A live run has its own series, labelled run_id, read from the real
// /metrics; with --run-metrics-retention 0 they go when the run ends, and
// no series carries otel_scope_*.
func TestPerRunMetricsFollowTheLiveRuns(t *testing.T) {
	c := startCoordinator(t, map[string]string{adminTokenEnv: adminToken}, "--run-metrics-retention", "0")
	spec := runSpec(1)
	spec.Reserve = &v1.ReserveSpec{MarginSeconds: 30, ExpectedCheckpointSeconds: proto.Float64(120), ExpectedSnapshotSeconds: proto.Float64(60)}
	resp := stepLiveRun(t, c, "live", spec, 7)
	runs := v1.NewRunServiceClient(dialWith(t, c.addr, nil))
	admin := bearer(t.Context(), adminToken)
	in := resp.GetDecision().GetInputs()
	wantSpare := in.GetMustSaveBy().AsTime().Sub(resp.GetDecision().GetDecidedAt().AsTime()).Seconds() -
		(in.GetIterationSeconds() + in.GetCheckpointSeconds() + in.GetSaveReserveSeconds() + in.GetMarginSeconds())

	before := time.Now()
	fams := scrapeMetrics(t, c.metricsAddr)
	after := time.Now()
	live := map[string]string{"run_id": "live"}
	for name, want := range map[string]float64{
		"snapcoord_run_iteration_seconds":          7,
		"snapcoord_run_checkpoint_seconds":         120,
		"snapcoord_run_save_reserve_seconds":       60,
		"snapcoord_run_margin_seconds":             30,
		"snapcoord_run_decision_spare_seconds":     wantSpare,
		"snapcoord_run_snapshot_failures_in_a_row": 0,
		"snapcoord_health_serving":                 1,
		"snapcoord_store_commit_failed":            0,
		"snapcoord_leader":                         1, // alone on its bbolt file
	} {
		labels := live
		if !strings.HasPrefix(name, "snapcoord_run_") {
			labels = nil
		}
		if got := seriesValue(fams, name, labels); math.Abs(got-want) > 1e-6 || fams[name] == nil {
			t.Errorf("%s%v = %v, want %v", name, labels, got, want)
		}
	}
	if got := seriesValue(fams, "snapcoord_run_state", map[string]string{"run_id": "live", "state": "running"}); got != 1 {
		t.Errorf("snapcoord_run_state{run_id=live,state=running} = %v, want 1", got)
	}
	// Until B and until fires_at count down from the scrape's time.
	b, fires := in.GetMustSaveBy().AsTime(), resp.GetDecision().GetInputs().GetMustSaveBy().AsTime().Add(-time.Duration(
		(in.GetIterationSeconds()+in.GetCheckpointSeconds()+in.GetSaveReserveSeconds()+in.GetMarginSeconds())*float64(time.Second)))
	for name, at := range map[string]time.Time{"snapcoord_run_until_must_save_by_seconds": b, "snapcoord_run_until_fires_at_seconds": fires} {
		got := seriesValue(fams, name, live)
		if lo, hi := at.Sub(after).Seconds()-1e-3, at.Sub(before).Seconds()+1e-3; got < lo || got > hi {
			t.Errorf("%s = %v, want between %v and %v", name, got, lo, hi)
		}
	}
	for name, fam := range fams {
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.HasPrefix(lp.GetName(), "otel_scope_") {
					t.Fatalf("%s carries label %s", name, lp.GetName())
				}
			}
		}
	}

	if _, err := runs.CancelRun(admin, &v1.CancelRunRequest{RunId: "live"}); err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	fams = scrapeMetrics(t, c.metricsAddr)
	for name, fam := range fams {
		if strings.HasPrefix(name, "snapcoord_run_") && hasRunID(fam, "live") {
			t.Errorf("%s still has a series for the cancelled run", name)
		}
	}
}

func hasRunID(fam *dto.MetricFamily, id string) bool {
	for _, m := range fam.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "run_id" && lp.GetValue() == id {
				return true
			}
		}
	}
	return false
}

// The metrics listener serves the status page at / (it was a 404), by
// RunService's rule, and /metrics as before.
func TestMetricsListenerServesTheStatusPage(t *testing.T) {
	c := startCoordinator(t, map[string]string{adminTokenEnv: adminToken})
	get := func(path, token string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+c.metricsAddr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/", "", http.StatusUnauthorized},
		{"/", adminToken, http.StatusOK},
		{"/runs/none", adminToken, http.StatusNotFound},
		{"/metrics", "", http.StatusOK},
		{"/nothing-here", adminToken, http.StatusNotFound},
	} {
		if got := get(tc.path, tc.token); got != tc.want {
			t.Errorf("GET %s (token %v): %d, want %d", tc.path, tc.token != "", got, tc.want)
		}
	}
}

// stepLiveRun creates run id from spec, registers its rank 0 and completes
// step 1 after an iteration of iter seconds: a live run with a decision.
func stepLiveRun(t *testing.T, c *served, id string, spec *v1.RunSpec, iter float64) *v1.CompleteStepResponse {
	t.Helper()
	conn := dialWith(t, c.addr, nil)
	runs, workers := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
	created, err := runs.CreateRun(bearer(t.Context(), adminToken), &v1.CreateRunRequest{RunId: id, Spec: spec})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	asRun := bearer(t.Context(), created.GetRunToken())
	w, err := workers.RegisterWorker(asRun, &v1.RegisterWorkerRequest{RunId: id, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"})
	if err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	resp, err := workers.CompleteStep(asRun, &v1.CompleteStepRequest{RunId: id, WorkerId: w.GetWorkerId(), Step: 1, IterationSeconds: iter})
	if err != nil {
		t.Fatalf("CompleteStep: %v", err)
	}
	return resp
}

// With no admin token the page is open, as RunService is: served on a
// loopback metrics listener, left out of one on every interface unless
// --insecure says so; /metrics is served either way.
func TestOpenStatusPageOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		wantPage int
	}{
		{"loopback", nil, http.StatusOK},
		{"all interfaces", []string{"--metrics-listen", "0.0.0.0:0"}, http.StatusNotFound},
		{"all interfaces, insecure", []string{"--metrics-listen", "0.0.0.0:0", "--insecure"}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCoordinator(t, nil, tc.args...)
			_, port, err := net.SplitHostPort(c.metricsAddr)
			if err != nil {
				t.Fatal(err)
			}
			for path, want := range map[string]int{"/": tc.wantPage, "/metrics": http.StatusOK} {
				resp, err := http.Get("http://127.0.0.1:" + port + path)
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				_ = resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
				}
			}
		})
	}
}
