package engine

import (
	"errors"
	"os"
	"strings"
	"testing"

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
			ok = ok || tr.to == cancelled && containsState(tr.from, live)
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
