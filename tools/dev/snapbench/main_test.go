package main

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
)

var snapcoordBin string

// TestMain builds the coordinator, and serves as the floor server when the
// bench re-executes this test binary for it.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == floorServerCmd {
		os.Exit(runFloorServer(os.Args[2:]))
	}
	os.Exit(coordproc.Main(m, &snapcoordBin))
}

// Every phase runs at toy sizes and yields its rows, as JSON too: the tool
// does not rot between benchmark runs. Each window is 500 ms: a figure
// counts only the calls that start and end inside it, and on a loaded
// machine one durable report of a single worker can take longer than 200 ms.
func TestEveryPhaseAtToySizes(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"--snapcoord", snapcoordBin, "--json", "--dir", t.TempDir(),
		"--warmup", "50ms", "--duration", "500ms", "--step-runs", "2", "--step-ranks", "2", "--report-workers", "1,4",
		"--fanout-workers", "20", "--workers-per-conn", "3", "--heartbeat-workers", "4",
		"--restart-runs", "5", "--restart-workers", "4", "--restart-steps", "2", "--restart-repeat", "1",
		"--only", "steps,reports,fanout,heartbeats,restart"}, &stdout, &stderr)
	got := rowsOf(t, code, &stdout, &stderr, "complete_step", "reports_1", "reports_4", "fanout_streaming", "fanout_polling", "memory_per_stream",
		"fanout_streaming_node", "memory_per_stream_node",
		"heartbeats", "heartbeat_cpu", "restart")
	if r := got["fanout_streaming"]; r.Lat == nil || r.Lat.Max <= 0 {
		t.Errorf("fan-out row has no latencies: %+v", r)
	}
}

// The etcd phase at toy sizes, on a real 3-member etcd cluster: the
// coordinator on etcd and the raw transactions are both measured.
func TestEtcdPhaseAtToySizes(t *testing.T) {
	etcdtest.Require(t)
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"--snapcoord", snapcoordBin, "--json", "--dir", t.TempDir(),
		"--warmup", "50ms", "--duration", "500ms", "--step-runs", "2", "--step-ranks", "2", "--report-workers", "1,4",
		"--only", "etcd"}, &stdout, &stderr)
	got := rowsOf(t, code, &stdout, &stderr, "etcd_decisions", "etcd_reports_1", "etcd_reports_4")
	if r := got["etcd_decisions"]; r.Lat == nil || r.FloorLat == nil || r.FloorLat.P50 <= 0 {
		t.Errorf("etcd decisions row has no latencies: %+v", r)
	}
}

// stormToy is the storm at a toy size: 3 runs × 2 ranks × 4 workers, two
// workers a connection, short steps and saves, B 3 s after registration.
var stormToy = []string{"--storm", "--storm-runs", "3", "--storm-ranks", "2", "--storm-workers", "4",
	"--storm-ranks-per-conn", "2", "--storm-workers-per-conn", "2", "--storm-step", "100ms-300ms", "--storm-save", "0s-100ms",
	"--storm-lead", "3s", "--storm-margin", "500ms", "--storm-timeout", "10s"}

// The storm at a toy size on bbolt, against the real binary and the
// floor: it exits 0 only if every rank was told to save and every worker
// got SaveAtDeadline, had its report acknowledged and was told to stop,
// and every run reads back STOPPED; each figure is there with its floor.
func TestStormAtToySize(t *testing.T) {
	checkStorm(t, "bbolt", "storm_")
}

// The same on a 3-member etcd cluster.
func TestStormOnEtcdAtToySize(t *testing.T) {
	etcdtest.Require(t)
	checkStorm(t, "etcd", "etcd_storm_")
}

func checkStorm(t *testing.T, store, prefix string) {
	var stdout, stderr bytes.Buffer
	args := append([]string{"--snapcoord", snapcoordBin, "--json", "--dir", t.TempDir(), "--storm-stores", store}, stormToy...)
	code := run(t.Context(), args, &stdout, &stderr)
	got := rowsOf(t, code, &stdout, &stderr, prefix+"decisions", prefix+"delivered", prefix+"durable", prefix+"rss")
	if r := got[prefix+"decisions"]; r.Lat == nil || r.Lat.P99 <= 0 || r.FloorLat == nil || r.FloorLat.P99 <= 0 {
		t.Errorf("decisions row has no latencies: %+v", r)
	}
	if r := got[prefix+"delivered"]; !strings.Contains(r.Note, "nothing lost: all 6 ranks") || !strings.Contains(r.Note, "all 12 workers") || !strings.Contains(r.Note, "all 3 runs read back STOPPED") {
		t.Errorf("delivered row does not say nothing was lost: %q", r.Note)
	}
	if r, ok := got[prefix+"cpu"]; !ok || !strings.Contains(r.Note, "the load tool took") || !strings.Contains(r.Note, "goroutines waiting") {
		t.Errorf("no row %scpu with the load tool's share and waits: %+v", prefix, r)
	}
}

// What the storm lost is named, so that the tool can exit non-zero on it.
func TestStormCheckNamesWhatWasLost(t *testing.T) {
	res := &stormResult{runs: 3, ranks: 6, fired: 6, saved: 6, workers: 12, got: 12, acked: 11, stopd: 11, stoppedRuns: 2}
	res.check()
	want := []string{"11 of 12 workers' snapshot reports acknowledged", "11 of 12 workers told Stop", "2 of 3 runs read back STOPPED at the step their ranks saved"}
	if !slices.Equal(res.problems, want) {
		t.Errorf("problems = %q, want %q", res.problems, want)
	}
	whole := &stormResult{runs: 3, ranks: 6, fired: 6, saved: 6, workers: 12, got: 12, acked: 12, stopd: 12, stoppedRuns: 3}
	if whole.check(); len(whole.problems) != 0 {
		t.Errorf("nothing lost, yet problems = %q", whole.problems)
	}
}

// rowsOf checks the run's exit code, decodes its JSON report and checks
// that each row of want is there with its figure and floor measured.
func rowsOf(t *testing.T, code int, stdout, stderr *bytes.Buffer, want ...string) map[string]row {
	t.Helper()
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	var rep report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("JSON: %v\n%s", err, stdout)
	}
	got := map[string]row{}
	for _, r := range rep.Rows {
		got[r.ID] = r
	}
	for _, id := range want {
		r, ok := got[id]
		if !ok {
			t.Errorf("no row %q in %s", id, stdout)
			continue
		}
		if r.Floor <= 0 || (r.Unit != "KiB" && r.Value <= 0) {
			t.Errorf("row %q: value %v, floor %v; want both measured", id, r.Value, r.Floor)
		}
	}
	return got
}

func TestSummarize(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 1000; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	l := summarize(d)
	if l.P50 != 500*time.Millisecond || l.P99 != 990*time.Millisecond || l.Max != time.Second {
		t.Errorf("summarize(1..1000 ms) = %+v, want p50 500ms, p99 990ms, max 1s", l)
	}
	if (summarize(nil) != latency{}) {
		t.Errorf("summarize(nil) = %+v, want zero", summarize(nil))
	}
}
