package engine

import (
	"context"
	"path/filepath"
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
	t   *testing.T
	ctx context.Context
	clk *clock.Fake
	dir string
	db  *store.DB
	e   *Engine
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, ctx: context.Background(), clk: clock.NewFake(t0), dir: t.TempDir()}
	h.open()
	t.Cleanup(h.close)
	return h
}

func (h *harness) open() {
	h.t.Helper()
	db, err := store.Open(filepath.Join(h.dir, "snapcoord.db"), store.Options{})
	if err != nil {
		h.t.Fatal(err)
	}
	e, err := New(h.ctx, db, Options{Clock: h.clk, HeartbeatInterval: 5 * time.Second})
	if err != nil {
		h.t.Fatal(err)
	}
	h.db, h.e = db, e
}

func (h *harness) close() {
	if h.e != nil {
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
	for r.durableCmd.Load() < cmd || r.durableEvent.Load() < ev {
		<-r.changed()
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
	for d > 0 {
		s := min(d, 5*time.Second)
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
