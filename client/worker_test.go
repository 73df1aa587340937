package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

func startEnvWorker(t *testing.T, cl *client.Client, runID string, poll bool) *client.Worker {
	t.Helper()
	w, err := cl.StartWorker(t.Context(), client.WorkerConfig{
		RunID: runID, Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-0", Poll: poll, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatalf("StartWorker: %v", err)
	}
	t.Cleanup(func() { closeWorker(t, w) })
	return w
}

// saveAtDeadline fires the deadline before any step, receives the
// SaveAtDeadline, reports it saved and receives the Stop that follows.
func saveAtDeadline(t *testing.T, admin *client.Client, runID string, w *client.Worker) {
	t.Helper()
	if _, err := admin.Runs.TriggerDeadline(t.Context(), &v1.TriggerDeadlineRequest{RunId: runID, Reason: "test"}); err != nil {
		t.Fatalf("TriggerDeadline: %v", err)
	}
	cmd := nextCommand(t, w)
	save := cmd.GetSaveAtDeadline()
	if save == nil || save.GetAnchorStep() != 0 || save.GetMustFinishBy() == nil {
		t.Fatalf("got %v, want a SaveAtDeadline anchored to step 0 with must_finish_by", cmd)
	}
	if _, err := w.ReportSnapshot(t.Context(), save.GetSnapshotId(), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 0, "ok"); err != nil {
		t.Fatalf("ReportSnapshot: %v", err)
	}
	stop := nextCommand(t, w)
	if stop.GetStop() == nil || stop.GetSeq() <= cmd.GetSeq() {
		t.Fatalf("got %v after seq %d, want a later Stop", stop, cmd.GetSeq())
	}
	if _, ok := <-w.Commands(); ok {
		t.Fatal("commands still open after the Stop")
	}
	if err := w.Err(); err != nil {
		t.Fatalf("Err after Stop = %v, want nil", err)
	}
	run, err := admin.Runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: runID})
	if err != nil || run.GetRun().GetState() != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("GetRun = %v, %v; want STOPPED", run.GetRun().GetState(), err)
	}
}

func TestWorkerReceivesCommands(t *testing.T) {
	for _, tc := range []struct {
		name          string
		poll          bool // asked for polling
		rejectStreams bool // the server answers StreamCommands UNIMPLEMENTED
		wantStreams   bool
	}{
		{name: "stream", wantStreams: true},
		{name: "poll", poll: true},
		{name: "stream rejected, falls back to poll", rejectStreams: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			co := startCoordinator(t)
			co.gate.set(func(g *gate) { g.rejectStreams = tc.rejectStreams })
			cl := co.createRun("r1", turnSpec(1))
			w := startEnvWorker(t, cl, "r1", tc.poll)

			saveAtDeadline(t, co.dial(""), "r1", w)

			streams, polls := co.gate.count("StreamCommands"), co.gate.count("PollCommands")
			if tc.wantStreams && (streams == 0 || polls != 0) {
				t.Errorf("StreamCommands %d, PollCommands %d calls; want streaming only", streams, polls)
			}
			if !tc.wantStreams && polls == 0 {
				t.Errorf("PollCommands never called")
			}
			if got := w.Polling(); got == tc.wantStreams {
				t.Errorf("Polling() = %v, want %v", got, !tc.wantStreams)
			}
		})
	}
}

// A coordinator restart between two commands: the worker resumes after the
// last seq it delivered, so it gets every later command exactly once. So
// does one whose coordinator comes back on another address of its list (a
// failover), streaming or polling.
func TestWorkerResumesAfterCoordinatorRestart(t *testing.T) {
	for _, tc := range []struct {
		name      string
		elsewhere bool // the coordinator comes back on the list's other address
		poll      bool
	}{
		{name: "same address"},
		{name: "another address of the list", elsewhere: true},
		{name: "another address of the list, polling", elsewhere: true, poll: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			co := startRestartable(t)
			list, restart := co.addr, co.restart
			if tc.elsewhere {
				other := freeAddr(t)
				list, restart = co.addr+","+other, func() { co.moveTo(other) }
			}
			resumeAcross(t, list, tc.poll, restart)
		})
	}
}

func resumeAcross(t *testing.T, list string, poll bool, restart func()) {
	admin := dialList(t, list, "")
	created, err := admin.Runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "r1", Spec: turnSpec(1)})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	cl := dialList(t, list, created.GetRunToken())
	env := startEnvWorker(t, cl, "r1", poll)
	trainer, err := cl.StartTrainer(t.Context(), client.TrainerConfig{RunID: "r1", Rank: 0, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("StartTrainer: %v", err)
	}
	t.Cleanup(func() { closeWorker(t, trainer) })
	var events []int64
	watched := make(chan error, 1)
	go func() {
		watched <- watchAll(admin, "r1", &events)
	}()

	// Step 1 and its checkpoint: a trainer-checkpoint snapshot follows.
	if d, err := trainer.CompleteStep(t.Context(), 1, 0); err != nil || d.GetAction() != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("CompleteStep(1) = %v, %v; want CONTINUE", d, err)
	}
	if _, err := trainer.ReportCheckpoint(t.Context(), 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 0); err != nil {
		t.Fatalf("ReportCheckpoint(1): %v", err)
	}
	first := nextCommand(t, env)
	if first.GetSnapshot().GetReason() != v1.SnapshotReason_SNAPSHOT_REASON_TRAINER_CHECKPOINT {
		t.Fatalf("got %v, want a trainer-checkpoint Snapshot", first)
	}
	if _, err := env.ReportSnapshot(t.Context(), first.GetSnapshot().GetSnapshotId(), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 0, ""); err != nil {
		t.Fatalf("ReportSnapshot: %v", err)
	}

	restart()
	// TriggerDeadline is not retried: wait for the coordinator with a read
	// that is, as an operator would try again.
	if _, err := admin.Runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "r1"}); err != nil {
		t.Fatalf("GetRun after the restart: %v", err)
	}

	// Step 2 fires the deadline by hand; its checkpoint is followed by the
	// deadline snapshot, delivered over the resumed stream.
	if _, err := admin.Runs.TriggerDeadline(t.Context(), &v1.TriggerDeadlineRequest{RunId: "r1"}); err != nil {
		t.Fatalf("TriggerDeadline: %v", err)
	}
	if d, err := trainer.CompleteStep(t.Context(), 2, 0); err != nil || d.GetAction() != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("CompleteStep(2) = %v, %v; want SAVE_AND_STOP", d, err)
	}
	if _, err := trainer.ReportCheckpoint(t.Context(), 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 0); err != nil {
		t.Fatalf("ReportCheckpoint(2): %v", err)
	}
	second := nextCommand(t, env)
	if second.GetSaveAtDeadline().GetAnchorStep() != 2 || second.GetSeq() <= first.GetSeq() {
		t.Fatalf("after seq %d got %v, want the SaveAtDeadline of step 2", first.GetSeq(), second)
	}
	if _, err := env.ReportSnapshot(t.Context(), second.GetSaveAtDeadline().GetSnapshotId(), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 0, ""); err != nil {
		t.Fatalf("ReportSnapshot: %v", err)
	}
	if stop := nextCommand(t, env); stop.GetStop() == nil {
		t.Fatalf("got %v, want Stop", stop)
	}
	if stop := nextCommand(t, trainer.Worker); stop.GetStop() == nil {
		t.Fatalf("trainer got %v, want Stop", stop)
	}

	// The event watch followed the run across the restart: every event
	// once, in order, up to the end.
	if err := <-watched; err != nil {
		t.Fatalf("WatchEvents: %v", err)
	}
	for i, seq := range events {
		if seq != int64(i+1) {
			t.Fatalf("event seqs %v: want 1..%d without gaps or repeats", events, len(events))
		}
	}
}

func watchAll(cl *client.Client, runID string, seqs *[]int64) error {
	return cl.WatchEvents(context.Background(), runID, 0, true, func(ev *v1.RunEvent) error {
		*seqs = append(*seqs, ev.GetSeq())
		return nil
	})
}

// A partition longer than the lease: the coordinator declares the worker
// lost; once it can reach the coordinator again the worker registers again
// and its commands resume on the new incarnation.
func TestWorkerRegistersAgainAfterLeaseLapsed(t *testing.T) {
	co := startCoordinator(t)
	cl := co.createRun("r1", turnSpec(1))
	admin := co.dial("")
	w := startEnvWorker(t, cl, "r1", false)

	var refused chan struct{}
	co.gate.set(func(g *gate) { g.partitioned, refused = true, g.registerRefused })
	awaitEvent(t, admin, "r1", "the worker declared LOST", func(ev *v1.RunEvent) bool {
		return ev.GetType() == v1.RunEventType_RUN_EVENT_TYPE_WORKER_LOST
	})
	// Healed only once the worker has presumed its lease lost: healed
	// before, its next heartbeat would bring it back as it was (a LOST
	// worker heartbeating is LIVE again), which is not what this tests.
	select {
	case <-refused:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker never tried to register again while partitioned")
	}
	co.gate.set(func(g *gate) { g.partitioned = false })
	awaitRegisteredAgain(t, admin, w)

	saveAtDeadline(t, admin, "r1", w)
}

// An operator (or a rank taking over the name) deregistered the worker: its
// heartbeat is refused, and it registers again.
func TestWorkerRegistersAgainAfterDeregistration(t *testing.T) {
	co := startCoordinator(t)
	cl := co.createRun("r1", turnSpec(1))
	admin := co.dial("")
	w := startEnvWorker(t, cl, "r1", false)

	if _, err := cl.Workers.DeregisterWorker(t.Context(), &v1.DeregisterWorkerRequest{RunId: "r1", WorkerId: w.ID()}); err != nil {
		t.Fatalf("DeregisterWorker: %v", err)
	}
	awaitRegisteredAgain(t, admin, w)

	saveAtDeadline(t, admin, "r1", w)
}

// awaitRegisteredAgain waits for the worker's second incarnation.
func awaitRegisteredAgain(t *testing.T, admin *client.Client, w *client.Worker) {
	t.Helper()
	awaitEvent(t, admin, "r1", "the worker registered again", func(ev *v1.RunEvent) bool {
		return ev.GetType() == v1.RunEventType_RUN_EVENT_TYPE_WORKER_REGISTERED && strings.Contains(ev.GetMessage(), "(incarnation 2)")
	})
	if got := workerState(t, admin, "r1", w.ID()); got.GetIncarnation() < 2 {
		t.Fatalf("worker %v, want a later incarnation", got)
	}
}

func TestWorkerCloseDeregisters(t *testing.T) {
	co := startCoordinator(t)
	cl := co.createRun("r1", turnSpec(1))
	w, err := cl.StartWorker(t.Context(), client.WorkerConfig{RunID: "r1", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-0", Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("StartWorker: %v", err)
	}
	closeWorker(t, w)
	if got := workerState(t, co.dial(""), "r1", w.ID()).GetState(); got != v1.WorkerState_WORKER_STATE_LEFT {
		t.Errorf("after Close the worker is %v, want LEFT", got)
	}
	if _, ok := <-w.Commands(); ok {
		t.Error("commands still open after Close")
	}
	closeWorker(t, w) // a second Close is harmless
}

func TestStartWorkerWithAWrongTokenFails(t *testing.T) {
	co := startCoordinator(t)
	co.createRun("r1", turnSpec(1))
	_, err := co.dial("not-the-token").StartWorker(t.Context(), client.WorkerConfig{
		RunID: "r1", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, Name: "env-0",
	})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("StartWorker with a wrong run token: %v, want UNAUTHENTICATED", err)
	}
}

// A replacement process registers under the name of a worker whose process
// still runs (a node thought dead): the old worker stops with ErrSuperseded
// instead of registering again and taking the name back, its Close leaves
// the replacement registered, and the replacement gets the commands.
func TestSupersededWorkerStops(t *testing.T) {
	for _, poll := range []bool{false, true} {
		t.Run(map[bool]string{false: "stream", true: "poll"}[poll], func(t *testing.T) {
			co := startCoordinator(t)
			cl := co.createRun("r1", turnSpec(1))
			admin := co.dial("")
			old := startEnvWorker(t, cl, "r1", poll)
			replacement := startEnvWorker(t, cl, "r1", poll)
			if replacement.ID() != old.ID() || replacement.Incarnation() != old.Incarnation()+1 {
				t.Fatalf("replacement %s incarnation %d, want %s incarnation %d",
					replacement.ID(), replacement.Incarnation(), old.ID(), old.Incarnation()+1)
			}

			select {
			case cmd, ok := <-old.Commands():
				if ok {
					t.Fatalf("the superseded worker got %v", cmd)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the superseded worker still runs after 15 s")
			}
			if err := old.Err(); !errors.Is(err, client.ErrSuperseded) {
				t.Fatalf("Err = %v, want ErrSuperseded", err)
			}
			closeWorker(t, old)
			if got := workerState(t, admin, "r1", replacement.ID()); got.GetState() != v1.WorkerState_WORKER_STATE_LIVE ||
				got.GetIncarnation() != replacement.Incarnation() {
				t.Fatalf("after the old worker closed: %v, want the replacement's incarnation %d LIVE", got, replacement.Incarnation())
			}
			saveAtDeadline(t, admin, "r1", replacement)
		})
	}
}

// A worker process dies after it received SaveAtDeadline and before it
// reported; the process started in its place gets the same SaveAtDeadline
// first, saves, and the run stops as planned.
func TestReplacementProcessDoesThePendingSave(t *testing.T) {
	co := startCoordinator(t)
	cl := co.createRun("r1", turnSpec(1))
	admin := co.dial("")
	died := startEnvWorker(t, cl, "r1", false)
	if _, err := admin.Runs.TriggerDeadline(t.Context(), &v1.TriggerDeadlineRequest{RunId: "r1", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	save := nextCommand(t, died).GetSaveAtDeadline()
	if save == nil {
		t.Fatal("no SaveAtDeadline")
	}

	replacement := startEnvWorker(t, cl, "r1", false)
	cmd := nextCommand(t, replacement)
	if cmd.GetSaveAtDeadline().GetSnapshotId() != save.GetSnapshotId() {
		t.Fatalf("the replacement's first command is %v, want the pending SaveAtDeadline %s", cmd, save.GetSnapshotId())
	}
	if _, err := replacement.ReportSnapshot(t.Context(), save.GetSnapshotId(), v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, time.Second, "ok"); err != nil {
		t.Fatal(err)
	}
	if stop := nextCommand(t, replacement); stop.GetStop() == nil {
		t.Fatalf("after the save: %v, want Stop", stop)
	}
	run, err := admin.Runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "r1"})
	if err != nil || run.GetRun().GetState() != v1.RunState_RUN_STATE_STOPPED {
		t.Fatalf("run %v, %v; want STOPPED", run.GetRun().GetState(), err)
	}
}

// PollWait goes out in whole seconds. Under a second it must not reach the
// coordinator as 0, answered at once (the worker would poll in a busy
// loop), nor over an hour as more than the API allows (refused: the worker
// would stop).
func TestWorkerPollWaitInWholeSeconds(t *testing.T) {
	for _, wait := range []time.Duration{200 * time.Millisecond, 2 * time.Hour} {
		t.Run(wait.String(), func(t *testing.T) {
			co := startCoordinator(t)
			cl := co.createRun("r1", turnSpec(1))
			w, err := cl.StartWorker(t.Context(), client.WorkerConfig{RunID: "r1", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT,
				Name: "env-0", Poll: true, PollWait: wait, Logger: testLogger(t)})
			if err != nil {
				t.Fatalf("StartWorker: %v", err)
			}
			t.Cleanup(func() { closeWorker(t, w) })

			// Ten heartbeats take a second at least (startCoordinatorWith):
			// two or three polls, each waiting for a command.
			awaitHeartbeats(t, co.gate, w, 10)
			if n := co.gate.count("PollCommands"); n > 10 {
				t.Errorf("%d PollCommands while the worker heartbeat 10 times with PollWait %v, want a few", n, wait)
			}
			saveAtDeadline(t, co.dial(""), "r1", w)
		})
	}
}

// awaitHeartbeats waits, at most 15 s, until the coordinator has had n
// heartbeats; it fails at once if the worker stopped.
func awaitHeartbeats(t *testing.T, g *gate, w *client.Worker, n int) {
	t.Helper()
	awaitCalls(t, g, w, "Heartbeat", n)
}
