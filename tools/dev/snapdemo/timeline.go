package main

import (
	"fmt"
	"strings"
	"sync"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

// timeline prints one line per happening, timed from the run's start.
type timeline struct {
	mu    sync.Mutex
	start time.Time
}

func newTimeline() *timeline { return &timeline{start: time.Now()} }

func (t *timeline) rel(at time.Time) string {
	return fmt.Sprintf("+%4.1fs", at.Sub(t.start).Seconds())
}

func (t *timeline) sayAt(at time.Time, who, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Printf("%7s  %-6s  %s\n", t.rel(at), who, fmt.Sprintf(format, args...))
}

func (t *timeline) say(who, format string, args ...any) { t.sayAt(time.Now(), who, format, args...) }

// event prints a run event from the coordinator.
func (t *timeline) event(ev *v1.RunEvent) error {
	at := ev.GetAt().AsTime()
	switch ev.GetType() {
	case v1.RunEventType_RUN_EVENT_TYPE_DECISION:
		t.sayAt(at, "coord", "%s", t.decision(ev.GetDecision()))
	case v1.RunEventType_RUN_EVENT_TYPE_COMMAND_ISSUED:
		// Snapshot commands repeat SNAPSHOT_ISSUED; the others are news.
		if !strings.Contains(ev.GetMessage(), "command snapshot ") {
			t.sayAt(at, "coord", "%s", ev.GetMessage())
		}
	default:
		t.sayAt(at, "coord", "%s", ev.GetMessage())
	}
	return nil
}

// decision: "step 7   CONTINUE        I 2.0 + C 0.8 + R 1.1 + M 1.0 s; a step ending after +33.2s saves".
func (t *timeline) decision(d *v1.Decision) string {
	in := d.GetInputs()
	action := apifacts.EnumName(d.GetAction())
	s := fmt.Sprintf("step %-3d %-13s I %.1f + C %.1f + R %.1f + M %.1f s", d.GetStep(), action,
		in.GetIterationSeconds(), in.GetCheckpointSeconds(), in.GetSaveReserveSeconds(), in.GetMarginSeconds())
	if f := in.GetFiresAt(); f != nil && d.GetAction() == v1.StepAction_STEP_ACTION_CONTINUE {
		s += fmt.Sprintf("; a step ending after %s saves", t.rel(f.AsTime()))
	}
	return s
}
