package engine

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// The table in states.go's comment, which the design document copies, is
// the one the engine enforces.
func TestStateTableIsDocumented(t *testing.T) {
	src, err := os.ReadFile("states.go")
	if err != nil {
		t.Fatal(err)
	}
	var doc strings.Builder
	for _, l := range strings.Split(string(src), "\n") {
		if s, ok := strings.CutPrefix(l, "//\t|"); ok {
			doc.WriteString("|" + s + "\n")
		}
	}
	if got, want := doc.String(), stateTable(); got != want {
		t.Errorf("the table in states.go's comment is not the table enforced; replace it by:\n%s", want)
	}
}

// No transition leaves a terminal state, and every live state has a way
// out to each end that can reach it.
func TestStateTableShape(t *testing.T) {
	for _, tr := range transitions {
		for _, from := range tr.from {
			if isTerminal(from) {
				t.Errorf("a transition leaves terminal state %s", stateName(from))
			}
		}
	}
	for _, live := range []v1.RunState{pending, running, saving, snapshotting} {
		ok := false
		for _, tr := range transitions {
			ok = ok || tr.to == cancelled && slices.Contains(tr.from, live)
		}
		if !ok {
			t.Errorf("live state %s cannot be cancelled", stateName(live))
		}
	}
}

// A state change no row allows is refused: the run stays as it was, with no
// event and no Stop, and the engine keeps the error for the tests.
func TestIllegalTransitionIsRefused(t *testing.T) {
	h := newHarness(t)
	h.create("r", turnSpec(1, ""))
	w := h.trainers("r", 1)[0]
	before := len(h.events("r"))
	r, err := h.e.run("r")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		to   v1.RunState
		want string
	}{
		{saving, "PENDING -> SAVING: no such transition"},
		{running, "PENDING -> RUNNING: guard does not hold: a step is recorded"}, // no step yet
		{stopped, "PENDING -> STOPPED: guard does not hold"},                     // the deadline did not fire
	} {
		r.mu.Lock()
		m := &mut{e: h.e, r: r, now: h.clk.Now()}
		if tc.to == stopped {
			m.terminate(tc.to, "a bug")
		} else {
			m.setState(tc.to, "a bug")
		}
		m.flush()
		r.mu.Unlock()
		bug := h.e.illegal.Swap(nil)
		if bug == nil || !errors.Is(*bug, errIllegalTransition) || !strings.Contains((*bug).Error(), tc.want) {
			t.Errorf("to %s: engine kept %v, want an illegal transition %q", stateName(tc.to), bug, tc.want)
		}
	}
	h.wantState("r", pending)
	if n := len(h.events("r")); n != before {
		t.Errorf("%d events after refused transitions, want %d", n, before)
	}
	if cmds := h.commands("r", w); len(cmds) != 0 {
		t.Errorf("commands after a refused terminate: %v", cmds)
	}
}

// An operator can cancel a run in the middle of its deadline save: it ends
// CANCELLED with one Stop to every worker, the deadline snapshot in flight
// closes as SKIPPED and takes no more reports, and no bound of the save
// (B, the snapshot's must_finish_by) fails the run afterwards.
func TestCancelDuringTheDeadlineSave(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		run  string
		want v1.RunState // when CancelRun comes
	}{{"saving", saving}, {"snapshotting", snapshotting}} {
		h.create(tc.run, turnSpec(1, "00:01:00:00"))
		ranks, envs := h.trainers(tc.run, 1), h.envs(tc.run, 1)
		h.stepAll(tc.run, ranks, 1, 10)
		if _, err := h.e.TriggerDeadline(h.ctx, &v1.TriggerDeadlineRequest{RunId: tc.run}); err != nil {
			t.Fatal(err)
		}
		if a := h.stepAll(tc.run, ranks, 2, 10); a != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
			t.Fatalf("%s: step 2 after TriggerDeadline: %v", tc.run, a)
		}
		if tc.want == snapshotting {
			h.checkpoint(tc.run, ranks, 2, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 1)
		}
		h.wantState(tc.run, tc.want)

		resp, err := h.e.CancelRun(h.ctx, &v1.CancelRunRequest{RunId: tc.run, Reason: "node drained"})
		if err != nil || resp.Run.State != cancelled {
			t.Fatalf("%s: CancelRun: %v, %v", tc.run, resp, err)
		}
		h.wantStopLast(tc.run, ranks[0], envs[0])
		if tc.want == snapshotting {
			s := h.lastSnapshot(tc.run)
			if s.Reason != v1.SnapshotReason_SNAPSHOT_REASON_DEADLINE || s.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED {
				t.Fatalf("%s: deadline snapshot %s %v, want SKIPPED", tc.run, s.Reason, s.Outcome)
			}
			err := h.report(tc.run, envs[0], s.SnapshotId, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, 1)
			wantErr(t, err, ErrFailedPrecondition, "CANCELLED")
		}
	}
	h.clk.Advance(2 * time.Hour) // past B and every bound of the save
	for _, run := range []string{"saving", "snapshotting"} {
		if got := h.wantState(run, cancelled); got.FailureMessage != "node drained" {
			t.Errorf("%s: failure_message %q, want the reason given", run, got.FailureMessage)
		}
	}
}
