package client_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
	coord "github.com/snapcoord/snapcoord/server/coordinator"
)

// copyStore stops the coordinator, copies its store file to a new
// directory and starts it again: a backup.
func (c *coordinator) copyStore() string {
	c.t.Helper()
	c.shutdown()
	dir := c.t.TempDir()
	copyFile(c.t, filepath.Join(c.cfg.DataDir, coord.StoreFile), filepath.Join(dir, coord.StoreFile))
	c.serve()
	return dir
}

// restoreStore stops the coordinator, puts the store file of backup in
// place of its own and starts it again: a restore from that backup.
func (c *coordinator) restoreStore(backup string) {
	c.t.Helper()
	c.shutdown()
	copyFile(c.t, filepath.Join(backup, coord.StoreFile), filepath.Join(c.cfg.DataDir, coord.StoreFile))
	c.serve()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// The coordinator's state goes back to a backup taken before the worker
// saw its last commands: the worker's resume point lies past the end of
// the command log, and the coordinator answers OUT_OF_RANGE. The worker
// reads the log again, does not get the command it already had once more
// (a snapshot the restored state still waits for), and gets the
// SaveAtDeadline issued after the restore, which reuses the seq of a
// command it saw before. An event watch across the restore reads the
// event log again the same way: no event twice, and the new ones.
func TestWorkerResyncsWhenTheLogWentBack(t *testing.T) {
	for _, poll := range []bool{false, true} {
		t.Run(map[bool]string{false: "stream", true: "poll"}[poll], func(t *testing.T) { resyncAfterRestore(t, poll) })
	}
}

func resyncAfterRestore(t *testing.T, poll bool) {
	co := startRestartable(t)
	cl := co.createRun("r1", turnSpec(1))
	admin := co.dial("")
	logs := logsink.NewWatcher()
	env, err := cl.StartWorker(t.Context(), client.WorkerConfig{RunID: "r1", Role: v1.WorkerRole_WORKER_ROLE_ENVIRONMENT,
		Name: "env-0", Poll: poll, Logger: slog.New(slog.NewJSONHandler(io.MultiWriter(logs, t.Output()), nil))})
	if err != nil {
		t.Fatalf("StartWorker: %v", err)
	}
	t.Cleanup(func() { closeWorker(t, env) })
	trainer, err := cl.StartTrainer(t.Context(), client.TrainerConfig{RunID: "r1", Rank: 0, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("StartTrainer: %v", err)
	}
	t.Cleanup(func() { closeWorker(t, trainer) })
	type seen struct {
		seq int64
		msg string
	}
	var events []seen
	watched, progress := make(chan error, 1), make(chan int64, 1000)
	go func() {
		watched <- admin.WatchEvents(t.Context(), "r1", 0, true, func(ev *v1.RunEvent) error {
			events = append(events, seen{ev.GetSeq(), ev.GetMessage()})
			progress <- ev.GetSeq()
			return nil
		})
	}()

	// nextEvent is the seq of the watch's next event. Waits are bounded: a
	// worker that stopped, or a watch that ended, fails the test rather than
	// hanging it.
	nextEvent := func() int64 {
		t.Helper()
		select {
		case seq := <-progress:
			return seq
		case err := <-watched:
			t.Fatalf("the watch ended early: %v", err)
		case <-time.After(15 * time.Second):
			t.Fatal("no event within 15 s")
		}
		return 0
	}
	checkpoint := func(step int64) *v1.Command {
		t.Helper()
		if _, err := trainer.CompleteStep(t.Context(), step, 0); err != nil {
			t.Fatalf("CompleteStep(%d): %v", step, err)
		}
		if _, err := trainer.ReportCheckpoint(t.Context(), step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 0); err != nil {
			t.Fatalf("ReportCheckpoint(%d): %v", step, err)
		}
		cmd := nextCommand(t, env)
		if cmd.GetSnapshot() == nil {
			t.Fatalf("after step %d's checkpoint got %v, want a Snapshot", step, cmd)
		}
		return cmd
	}
	report := func(id string) {
		t.Helper()
		if _, err := env.ReportSnapshot(t.Context(), id, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 0, ""); err != nil {
			t.Fatalf("ReportSnapshot(%s): %v", id, err)
		}
	}

	first := checkpoint(1)
	backup := co.copyStore() // the first snapshot waits for env-0's report here
	report(first.GetSnapshot().GetSnapshotId())
	second := checkpoint(2)
	report(second.GetSnapshot().GetSnapshotId())

	// The watch has every event so far: the restore takes some away.
	run, err := admin.Runs.GetRun(t.Context(), &v1.GetRunRequest{RunId: "r1"})
	if err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	for seq := int64(0); seq < run.GetRun().GetLastEventSeq(); {
		seq = nextEvent()
	}
	registered := logs.Next("registered again", "")
	co.restoreStore(backup)
	// The worker meets OUT_OF_RANGE and registers again to resync: its only
	// registration here, since its lease outlasts the restarts
	// (startRestartable). A registration for a lapsed lease would let the
	// test issue the SaveAtDeadline before the worker came back, and the log
	// would grow to its cursor first (see below).
	select {
	case <-registered:
	case <-time.After(15 * time.Second):
		t.Fatalf("the worker did not register again within 15 s of the restore (stopped: %v)", env.Err())
	}
	// And the watch read the restored log again: an event at a seq it had
	// delivered before. (Had the log grown past its cursor before it came
	// back, it would have seen no OUT_OF_RANGE and missed the events in
	// between: the cursor rule catches a log that is behind, not one that
	// caught up.)
	for seq := run.GetRun().GetLastEventSeq() + 1; seq > run.GetRun().GetLastEventSeq(); {
		seq = nextEvent()
	}

	if _, err := admin.Runs.TriggerDeadline(t.Context(), &v1.TriggerDeadlineRequest{RunId: "r1", Reason: "test"}); err != nil {
		t.Fatalf("TriggerDeadline: %v", err)
	}
	if d, err := trainer.CompleteStep(t.Context(), 2, 0); err != nil || d.GetAction() != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Fatalf("CompleteStep(2) after the restore = %v, %v; want SAVE_AND_STOP", d, err)
	}
	if _, err := trainer.ReportCheckpoint(t.Context(), 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 0); err != nil {
		t.Fatalf("ReportCheckpoint(2): %v", err)
	}
	save := nextCommand(t, env)
	if save.GetSaveAtDeadline().GetAnchorStep() != 2 {
		t.Fatalf("after the resync got %v, want the SaveAtDeadline of step 2 (the first snapshot's command was delivered before)", save)
	}
	if save.GetSeq() > second.GetSeq() {
		t.Fatalf("SaveAtDeadline seq %d: want one the log held before the restore (<= %d), or nothing was resynchronised", save.GetSeq(), second.GetSeq())
	}
	report(save.GetSaveAtDeadline().GetSnapshotId())
	if stop := nextCommand(t, env); stop.GetStop() == nil {
		t.Fatalf("got %v, want Stop", stop)
	}

	if err := <-watched; err != nil {
		t.Fatalf("WatchEvents across the restore: %v", err)
	}
	delivered := map[seen]bool{}
	for _, ev := range events {
		if delivered[ev] {
			t.Fatalf("event %d %q delivered twice", ev.seq, ev.msg)
		}
		delivered[ev] = true
	}
	reused := 0 // seqs delivered again with other content: the restored log's new events
	for i, ev := range events {
		if i > 0 && ev.seq <= events[i-1].seq {
			reused++
		}
	}
	if reused == 0 {
		t.Fatalf("events %v: none after the restore, or the watch did not read the restored log again", events)
	}
}

// A watch asked to start past the end of the event log is told so, rather
// than shown events from before the seq it asked to start after.
func TestWatchFromPastTheEndIsOutOfRange(t *testing.T) {
	co := startCoordinator(t)
	co.createRun("r1", turnSpec(1))
	err := co.dial("").WatchEvents(t.Context(), "r1", 1000, false, func(ev *v1.RunEvent) error {
		t.Errorf("delivered %v", ev)
		return nil
	})
	if status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "after_seq 1000 is past the run's last event") {
		t.Fatalf("WatchEvents after 1000 of a new run: %v; want OUT_OF_RANGE naming after_seq", err)
	}
}
