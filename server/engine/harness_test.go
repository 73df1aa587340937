package engine

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/store"
)

// t0 is the fake clock's start: runs in these tests start here.
var t0 = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

// harness is an engine on a real bbolt file with a fake clock.
type harness struct {
	t   testing.TB
	ctx context.Context
	clk *clock.Fake
	dir string
	db  *store.DB
	e   *Engine

	opts      Options // Clock defaults to clk; a wrapper of clk otherwise
	storeOpts store.Options
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessWith(t, Options{HeartbeatInterval: 5 * time.Second})
}

// newHarnessWith is newHarness with other engine options (e.g. a longer
// heartbeat interval, so that advance can take larger steps).
func newHarnessWith(t testing.TB, opts Options) *harness {
	t.Helper()
	return newHarnessStore(t, opts, store.Options{})
}

// newHarnessStore is newHarnessWith with store options (e.g. an OnCommit
// that holds the committer).
func newHarnessStore(t testing.TB, opts Options, storeOpts store.Options) *harness {
	t.Helper()
	h := &harness{t: t, ctx: context.Background(), clk: clock.NewFake(t0), dir: t.TempDir(), opts: opts, storeOpts: storeOpts}
	h.open()
	t.Cleanup(h.close)
	return h
}

func (h *harness) open() {
	h.t.Helper()
	db, err := store.Open(filepath.Join(h.dir, "snapcoord.db"), h.storeOpts)
	if err != nil {
		h.t.Fatal(err)
	}
	opts := h.opts
	if opts.Clock == nil {
		opts.Clock = h.clk
	}
	e, err := New(h.ctx, db, opts)
	if err != nil {
		h.t.Fatal(err)
	}
	h.db, h.e = db, e
}

func (h *harness) close() {
	if h.e != nil {
		if bug := h.e.illegal.Load(); bug != nil {
			h.t.Errorf("the engine refused a state change: %v", *bug)
		}
		h.e.Close()
		if err := h.db.Close(); err != nil {
			h.t.Error(err)
		}
		h.e, h.db = nil, nil
	}
}

// restart simulates a coordinator restart on the same data file.
func (h *harness) restart() {
	h.t.Helper()
	h.close()
	h.open()
}

func (h *harness) create(id string, spec *v1.RunSpec) *v1.Run {
	h.t.Helper()
	resp, err := h.e.CreateRun(h.ctx, &v1.CreateRunRequest{RunId: id, Spec: spec})
	if err != nil {
		h.t.Fatalf("CreateRun: %v", err)
	}
	return resp.Run
}

func (h *harness) get(id string) *v1.Run {
	h.t.Helper()
	resp, err := h.e.GetRun(h.ctx, &v1.GetRunRequest{RunId: id})
	if err != nil {
		h.t.Fatalf("GetRun: %v", err)
	}
	return resp.Run
}

func (h *harness) register(run string, role v1.WorkerRole, name string, rank int32) string {
	h.t.Helper()
	resp, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: run, Role: role, Name: name, Rank: rank})
	if err != nil {
		h.t.Fatalf("RegisterWorker %s: %v", name, err)
	}
	return resp.WorkerId
}

// registerAgain registers a trainer rank's name again, as its restarted
// process does.
func (h *harness) registerAgain(run, name string, rank int32) *v1.RegisterWorkerResponse {
	h.t.Helper()
	resp, err := h.e.RegisterWorker(h.ctx, &v1.RegisterWorkerRequest{RunId: run, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: name, Rank: rank})
	if err != nil {
		h.t.Fatalf("RegisterWorker %s again: %v", name, err)
	}
	return resp
}

func (h *harness) trainers(run string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = h.register(run, v1.WorkerRole_WORKER_ROLE_TRAINER, "rank-"+itoa(i), int32(i))
	}
	return ids
}

func (h *harness) envs(run string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = h.register(run, v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, "env-"+itoa(i), 0)
	}
	return ids
}

// snapshotInFlight creates run with one trainer rank and n environment
// workers, and has the rank complete step 1 and save its checkpoint: a
// trainer-checkpoint snapshot is then in flight.
func (h *harness) snapshotInFlight(run string, n int) (ranks, envs []string) {
	h.t.Helper()
	h.create(run, turnSpec(1, ""))
	ranks = h.trainers(run, 1)
	envs = h.envs(run, n)
	h.stepAll(run, ranks, 1, 10)
	h.checkpoint(run, ranks, 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 5)
	return ranks, envs
}

func itoa(i int) string { return string(rune('a'+i/26)) + string(rune('a'+i%26)) }

func (h *harness) step(run, worker string, step int64, iter float64) *v1.Decision {
	h.t.Helper()
	resp, err := h.e.CompleteStep(h.ctx, &v1.CompleteStepRequest{RunId: run, WorkerId: worker, Step: step, IterationSeconds: iter})
	if err != nil {
		h.t.Fatalf("CompleteStep: %v", err)
	}
	return resp.Decision
}

// stepAll has every rank complete the step and checks they agree.
func (h *harness) stepAll(run string, ranks []string, step int64, iter float64) v1.StepAction {
	h.t.Helper()
	first := h.step(run, ranks[0], step, iter)
	for _, w := range ranks[1:] {
		if d := h.step(run, w, step, iter); !proto.Equal(d, first) {
			h.t.Fatalf("step %d: rank %s got %v, rank 0 got %v", step, w, d, first)
		}
	}
	return first.Action
}

func (h *harness) checkpoint(run string, ranks []string, step int64, phase v1.CheckpointPhase, sec float64) {
	h.t.Helper()
	for _, w := range ranks {
		if _, err := h.e.ReportCheckpoint(h.ctx, &v1.ReportCheckpointRequest{RunId: run, WorkerId: w, Step: step, Phase: phase, SaveSeconds: sec}); err != nil {
			h.t.Fatalf("ReportCheckpoint %s: %v", w, err)
		}
	}
}

func (h *harness) report(run, worker, snap string, outcome v1.SnapshotOutcome, sec float64) error {
	_, err := h.e.ReportSnapshot(h.ctx, &v1.ReportSnapshotRequest{RunId: run, WorkerId: worker, SnapshotId: snap, Outcome: outcome, DurationSeconds: sec})
	return err
}

// poll returns the commands for a worker after seq without waiting.
func (h *harness) poll(run, worker string, after int64) []*v1.Command {
	h.t.Helper()
	resp, err := h.e.PollCommands(h.ctx, &v1.PollCommandsRequest{RunId: run, WorkerId: worker, AfterSeq: after})
	if err != nil {
		h.t.Fatalf("PollCommands: %v", err)
	}
	return resp.Commands
}

// settle waits until every command and event submitted so far is visible to
// readers (they are published asynchronously once durable).
func (h *harness) settle(run string) {
	h.t.Helper()
	r, err := h.e.run(run)
	if err != nil {
		h.t.Fatal(err)
	}
	r.mu.Lock()
	cmd, ev, last := r.rec.LastCommandSeq, r.rec.Run.LastEventSeq, r.last
	r.mu.Unlock()
	if err := h.e.wait(h.ctx, last); err != nil {
		h.t.Fatal(err)
	}
	for {
		// Take the channel before checking, or a publish between the check
		// and the wait would leave us waiting for a change that never comes.
		changed := r.changed()
		if r.durableCmd.Load() >= cmd && r.durableEvent.Load() >= ev {
			return
		}
		<-changed
	}
}

func (h *harness) events(run string) []*v1.RunEvent {
	h.t.Helper()
	h.settle(run)
	var out []*v1.RunEvent
	err := h.e.WatchRun(h.ctx, &v1.WatchRunRequest{RunId: run, NoFollow: true}, func(ev *v1.RunEvent) error {
		out = append(out, ev)
		return nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// beat heartbeats every given worker.
func (h *harness) beat(run string, workers ...string) {
	h.t.Helper()
	for _, w := range workers {
		if _, err := h.e.Heartbeat(h.ctx, &v1.HeartbeatRequest{RunId: run, WorkerId: w}); err != nil {
			h.t.Fatalf("Heartbeat %s: %v", w, err)
		}
	}
}

// advance moves the clock in heartbeat-sized steps, keeping the given
// workers alive.
func (h *harness) advance(d time.Duration, run string, alive ...string) {
	h.t.Helper()
	beat := h.opts.HeartbeatInterval
	if beat <= 0 {
		beat = 5 * time.Second
	}
	for d > 0 {
		s := min(d, beat)
		h.clk.Advance(s)
		h.beat(run, alive...)
		d -= s
	}
}

func turnSpec(ranks int32, budget string) *v1.RunSpec {
	return &v1.RunSpec{
		TrainerWorldSize: ranks,
		Checkpointing:    &v1.CheckpointingSpec{CheckpointMustSaveBy: budget},
		RolloutRecovery:  &v1.RolloutRecoverySpec{TargetLevel: v1.TargetLevel_TARGET_LEVEL_TURN},
	}
}

// intervalSpec is one trainer rank, a snapshot attempt every minute, a
// snapshot timeout of 30 s and the given max_consecutive_failures.
func intervalSpec(maxFailures int32) *v1.RunSpec {
	return &v1.RunSpec{
		TrainerWorldSize: 1,
		RolloutCheckpointing: &v1.RolloutCheckpointingSpec{SnapshotAttemptIntervalS: ptr[int32](60),
			SnapshotTimeoutS: 30, MaxConsecutiveFailures: maxFailures},
	}
}

// reportMsg is report with the worker's message.
func (h *harness) reportMsg(run, worker, snap string, outcome v1.SnapshotOutcome, sec float64, msg string) error {
	_, err := h.e.ReportSnapshot(h.ctx, &v1.ReportSnapshotRequest{RunId: run, WorkerId: worker, SnapshotId: snap,
		Outcome: outcome, DurationSeconds: sec, Message: msg})
	return err
}

// reportAll has every given environment worker report the same outcome.
func (h *harness) reportAll(run string, workers []string, snap string, outcome v1.SnapshotOutcome) {
	h.t.Helper()
	for _, w := range workers {
		if err := h.report(run, w, snap, outcome, 1); err != nil {
			h.t.Fatalf("ReportSnapshot %s %s: %v", w, snap, err)
		}
	}
}

// commands settles the run and returns every command the worker can see.
func (h *harness) commands(run, worker string) []*v1.Command {
	h.t.Helper()
	h.settle(run)
	return h.poll(run, worker, 0)
}

// snapshots lists the run's snapshots, oldest first, following the pages.
func (h *harness) snapshots(run string) []*v1.Snapshot {
	h.t.Helper()
	var all []*v1.Snapshot
	req := &v1.ListSnapshotsRequest{RunId: run}
	for {
		resp, err := h.e.ListSnapshots(h.ctx, req)
		if err != nil {
			h.t.Fatalf("ListSnapshots: %v", err)
		}
		all = append(all, resp.Snapshots...)
		if req.PageToken = resp.NextPageToken; req.PageToken == "" {
			return all
		}
	}
}

// lastSnapshot is the most recently issued snapshot; it fails the test if
// there is none.
func (h *harness) lastSnapshot(run string) *v1.Snapshot {
	h.t.Helper()
	s := h.snapshots(run)
	if len(s) == 0 {
		h.t.Fatal("no snapshot was issued")
	}
	return s[len(s)-1]
}

// eventsOf returns the run's events of one type.
func (h *harness) eventsOf(run string, typ v1.RunEventType) []*v1.RunEvent {
	h.t.Helper()
	var out []*v1.RunEvent
	for _, ev := range h.events(run) {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// wantState fails the test unless the run is in state s.
func (h *harness) wantState(run string, s v1.RunState) *v1.Run {
	h.t.Helper()
	got := h.get(run)
	if got.State != s {
		h.t.Fatalf("run %s is %v, want %v (failure_message %q)", run, got.State, s, got.FailureMessage)
	}
	return got
}

// wantStopLast checks that each worker's last command is Stop and that it
// got exactly one.
func (h *harness) wantStopLast(run string, workers ...string) {
	h.t.Helper()
	for _, w := range workers {
		cmds := h.commands(run, w)
		stops := 0
		for _, c := range cmds {
			if c.GetStop() != nil {
				stops++
			}
		}
		if len(cmds) == 0 || cmds[len(cmds)-1].GetStop() == nil || stops != 1 {
			h.t.Fatalf("worker %s: commands %v, want exactly one Stop, last", w, cmds)
		}
	}
}

// wantErr checks an error's kind and that its message names field.
func wantErr(t *testing.T, err, kind error, field string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v naming %q", kind, field)
	}
	if !errors.Is(err, kind) {
		t.Fatalf("error %q is not %v", err, kind)
	}
	if !strings.Contains(err.Error(), field) {
		t.Fatalf("error %q does not name %q", err, field)
	}
}

func ptr[T any](v T) *T { return &v }
