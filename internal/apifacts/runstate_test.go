package apifacts

import (
	"testing"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// The four end states are terminal, the live ones and unknown numbers not.
func TestTerminal(t *testing.T) {
	for s, want := range map[v1.RunState]bool{
		v1.RunState_RUN_STATE_UNSPECIFIED:  false,
		v1.RunState_RUN_STATE_PENDING:      false,
		v1.RunState_RUN_STATE_RUNNING:      false,
		v1.RunState_RUN_STATE_SAVING:       false,
		v1.RunState_RUN_STATE_SNAPSHOTTING: false,
		v1.RunState_RUN_STATE_STOPPED:      true,
		v1.RunState_RUN_STATE_COMPLETED:    true,
		v1.RunState_RUN_STATE_FAILED:       true,
		v1.RunState_RUN_STATE_CANCELLED:    true,
		v1.RunState(-1):                    false,
		v1.RunState(99):                    false,
	} {
		if got := Terminal(s); got != want {
			t.Errorf("Terminal(%v) = %v, want %v", s, got, want)
		}
	}
}
