package statuspage_test

import (
	"context"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/server/statuspage"
	"github.com/snapcoord/snapcoord/server/transport"
)

// leaseTTL is the world engine's: 3 × its 30 s heartbeat interval.
const leaseTTL = 90 * time.Second

type oneEngine struct{ *engine.Engine }

func (e oneEngine) For(context.Context) *engine.Engine { return e.Engine }

// fleet is a run of two trainer ranks and two environment workers in the
// world, whose ranks complete steps over a real gRPC server.
type fleet struct {
	w       *world
	steps   v1.WorkerServiceClient
	ids     map[string]string // worker name -> id
	stepped map[string]int64  // rank name -> its last step
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	w := newWorld(t)
	w.page = statuspage.New(statuspage.Options{Runs: w.eng, Admit: allow{}, Now: w.clk.Now, LeaseTTL: leaseTTL})
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	v1.RegisterWorkerServiceServer(gs, transport.NewWorkerServer(oneEngine{w.eng}, slog.New(slog.DiscardHandler)))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///page", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	spec := spectest.Checkpointed(2, "00:01:00:00")
	spec.RolloutCheckpointing = &v1.RolloutCheckpointingSpec{SnapshotAttemptIntervalS: proto.Int32(150)}
	spec.Reserve = &v1.ReserveSpec{MarginSeconds: 30, ExpectedCheckpointSeconds: proto.Float64(0.003), ExpectedSnapshotSeconds: proto.Float64(20)}
	if _, err := w.eng.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "r", Spec: spec}); err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	f := &fleet{w: w, steps: v1.NewWorkerServiceClient(conn), ids: map[string]string{}, stepped: map[string]int64{}}
	for _, wk := range []struct {
		name string
		role v1.WorkerRole
		rank int32
	}{{"rank-0", v1.WorkerRole_WORKER_ROLE_TRAINER, 0}, {"rank-1", v1.WorkerRole_WORKER_ROLE_TRAINER, 1},
		{"env-0", v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, 0}, {"env-1", v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, 0}} {
		name := wk.name
		resp, err := w.eng.RegisterWorker(t.Context(), &v1.RegisterWorkerRequest{RunId: "r", Role: wk.role, Name: name, Rank: wk.rank})
		if err != nil {
			t.Fatalf("RegisterWorker(%s): %v", name, err)
		}
		f.ids[name] = resp.GetWorkerId()
	}
	return f
}

// allow admits everyone: these tests are about what the page shows.
type allow struct{}

func (allow) CheckViewer(string, bool) error { return nil }

// tick lets d pass with the named workers heartbeating.
func (f *fleet) tick(d time.Duration, beating ...string) {
	f.w.t.Helper()
	f.w.clk.Advance(d)
	for _, name := range beating {
		if _, err := f.w.eng.Heartbeat(context.Background(), &v1.HeartbeatRequest{RunId: "r", WorkerId: f.ids[name]}); err != nil {
			f.w.t.Fatalf("Heartbeat(%s): %v", name, err)
		}
	}
}

// step has each named rank complete its next step over gRPC.
func (f *fleet) step(ranks ...string) {
	f.w.t.Helper()
	for _, name := range ranks {
		f.stepped[name]++
		if _, err := f.steps.CompleteStep(context.Background(), &v1.CompleteStepRequest{RunId: "r", WorkerId: f.ids[name],
			Step: f.stepped[name], IterationSeconds: 10}); err != nil {
			f.w.t.Fatalf("CompleteStep(%s, %d): %v", name, f.stepped[name], err)
		}
	}
}

// lane is the workers-table row of the named worker.
func lane(t *testing.T, page, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr class="([^"]*)" data-worker="` + regexp.QuoteMeta(name) + `">(.*?)</tr>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no lane for %s in the workers table:\n%s", name, page)
	}
	return m[1] + " " + m[2]
}

// The run page has a lane per worker: a rank that stopped completing
// steps while the other went on is flagged behind, an environment worker
// that stopped heartbeating is flagged silent (LOST), a failed snapshot is
// red in its worker's lane and in the snapshot table, and the healthy
// workers are not flagged.
func TestWorkerLanesFlagALaggingRankAndASilentWorker(t *testing.T) {
	f := newFleet(t)
	ctx := context.Background()
	live := []string{"rank-0", "rank-1", "env-0"} // env-1 never heartbeats
	f.tick(30*time.Second, live...)
	f.step("rank-0", "rank-1")
	for range 4 {
		f.tick(30*time.Second, live...)
		f.step("rank-0")
	}
	// 150 s: env-1 (lease 90 s) is LOST; the interval snapshot went to env-0.
	poll, err := f.w.eng.PollCommands(ctx, &v1.PollCommandsRequest{RunId: "r", WorkerId: f.ids["env-0"]})
	if err != nil {
		t.Fatalf("PollCommands: %v", err)
	}
	var snap string
	for _, c := range poll.GetCommands() {
		if s := c.GetSnapshot(); s != nil {
			snap = s.GetSnapshotId()
		}
	}
	if snap == "" {
		t.Fatalf("no interval snapshot for env-0 after 150 s: %v", poll.GetCommands())
	}
	f.tick(2*time.Second, live...)
	if _, err := f.w.eng.ReportSnapshot(ctx, &v1.ReportSnapshotRequest{RunId: "r", WorkerId: f.ids["env-0"], SnapshotId: snap,
		Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, DurationSeconds: 1.5, Message: "disk full"}); err != nil {
		t.Fatalf("ReportSnapshot: %v", err)
	}

	page := f.w.admin("/runs/r")
	rank0, rank1, env0, env1 := lane(t, page, "rank-0"), lane(t, page, "rank-1"), lane(t, page, "env-0"), lane(t, page, "env-1")
	for name, l := range map[string]string{"rank-0": rank0, "env-0": env0} {
		if strings.Contains(l, "lagging") || strings.Contains(l, "silent") || strings.Contains(l, `class="flag"`) {
			t.Errorf("%s is healthy but flagged: %s", name, l)
		}
	}
	if !strings.Contains(rank0, "step 5, ") || !strings.Contains(rank0, "trainer rank") {
		t.Errorf("rank-0's lane does not give its last step 5: %s", rank0)
	}
	if !strings.HasPrefix(rank1, "worker lagging") || !strings.Contains(rank1, "step 1, 2m2s ago") ||
		!strings.Contains(rank1, "4 steps behind the run&#39;s step 5") {
		t.Errorf("rank-1 (step 1 while the run is at 5) is not flagged 4 steps behind: %s", rank1)
	}
	if !strings.Contains(env1, "silent") || !strings.Contains(env1, ">lost<") || !strings.Contains(env1, "SILENT") {
		t.Errorf("env-1 (no heartbeat for 152 s, lease 90 s) is not flagged silent: %s", env1)
	}
	if !strings.Contains(env0, `class="cell io-error"`) || !strings.Contains(env0, "disk full") ||
		!strings.Contains(env0, `io_error 0s ago (took 1.5s)`) {
		t.Errorf("env-0's lane lacks its failed snapshot (red cell, message) or its last report: %s", env0)
	}
	if !strings.Contains(page, `<td class="io-error">io_error</td>`) || !strings.Contains(page, "svg .snapshot.io-error") ||
		!strings.Contains(page, `class="snapshot io-error reason-interval"`) {
		t.Error("the failed snapshot is not drawn with the class its red style selects")
	}
	if !strings.Contains(page, `id="flagged"`) || !strings.Contains(page, "2 worker(s) need attention") {
		t.Errorf("the page does not sum up the two flagged workers at the top:\n%s", page)
	}
}

// Decisions read newest first, each with why in durations, not timestamp
// arithmetic; a small C reads "3ms", not "0s".
func TestDecisionsNewestFirstWithAHumanWhy(t *testing.T) {
	f := newFleet(t)
	for range 3 {
		f.tick(30*time.Second, "rank-0", "rank-1", "env-0", "env-1")
		f.step("rank-0", "rank-1")
	}
	page := f.w.admin("/runs/r")
	table := page[strings.Index(page, `<table id="decisions">`):]
	table = table[:strings.Index(table, "</table>")]
	rows := regexp.MustCompile(`<tr><td class="num">(\d+)</td>.*?<td title="([^"]*)">([^<]*)</td></tr>`).FindAllStringSubmatch(table, -1)
	if len(rows) != 3 || rows[0][1] != "3" || rows[2][1] != "1" {
		t.Fatalf("decision rows %v, want steps 3, 2, 1", rows)
	}
	// Step 3 at 90 s: I 10 s, C 3 ms, R 20 s; B − M is 59m30s after creation.
	if got, want := rows[0][3], "one more step and the save need 30s; 58m left before B − M: continue"; got != want {
		t.Errorf("step 3's why = %q, want %q", got, want)
	}
	if !strings.HasPrefix(rows[0][2], "now&#43;I&#43;C") {
		t.Errorf("the rule's own explanation is not kept as the row's title: %q", rows[0][2])
	}
	if !strings.Contains(page, "10s + 3ms + 20s + 30s") {
		t.Errorf("I + C + R + M do not read 10s + 3ms + 20s + 30s")
	}
}

// A run not started by its B (no step, no save) is flagged in the list and
// on its page, with how late it is.
func TestPendingRunPastBIsFlagged(t *testing.T) {
	w := newWorld(t)
	if _, err := w.eng.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "idle", Spec: spectest.Checkpointed(1, "00:00:05:00")}); err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	if page := w.admin("/"); strings.Contains(page, "PAST B") {
		t.Fatalf("flagged past B before B:\n%s", page)
	}
	w.clk.Advance(12*time.Minute + 30*time.Second)
	for _, path := range []string{"/", "/runs/idle"} {
		if page := w.admin(path); !strings.Contains(page, `class="past-b"`) || !strings.Contains(page, "PAST B by 7m30s: not saved") {
			t.Errorf("GET %s: the run 7m30s past B is not flagged:\n%s", path, page)
		}
	}
}
