package client

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// The plan's fixture: step 10 decided CONTINUE at t0 with B a minute later,
// I 5 s, C 4 s, R 3 s, M 2 s; W 5 s, P 0.5 s. Step 10+d ends, projected, at
// t0 + 5.5·d + 4·k + 4.5, and fires once that + 14 s reaches B: at d = 8
// with no save since the anchor (62.5 s >= 60 s; d = 7 gives 57 s), at
// d = 7 after one or two saves, at d = 6 after three.
var planT0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func planDecision(mutate func(*v1.Decision)) *v1.Decision {
	d := &v1.Decision{Step: 10, Action: v1.StepAction_STEP_ACTION_CONTINUE, DecidedAt: timestamppb.New(planT0),
		Inputs: &v1.Deadline{MustSaveBy: timestamppb.New(planT0.Add(time.Minute)),
			IterationSeconds: 5, CheckpointSeconds: 4, SaveReserveSeconds: 3, MarginSeconds: 2}}
	if mutate != nil {
		mutate(d)
	}
	return d
}

func planOf(mutate func(*v1.Decision)) localPlan {
	return newLocalPlan(planDecision(mutate), 5*time.Second, 500*time.Millisecond)
}

func TestLocalPlanDecides(t *testing.T) {
	early := planT0.Add(10 * time.Second) // the rank's clock, far from B
	const (
		cont = v1.StepAction_STEP_ACTION_CONTINUE
		save = v1.StepAction_STEP_ACTION_SAVE_AND_STOP
		stop = v1.StepAction_STEP_ACTION_STOP
	)
	for _, tc := range []struct {
		name      string
		mutate    func(*v1.Decision)
		step      int64
		saves     int
		now       time.Time
		want      v1.StepAction
		emergency bool
	}{
		{name: "the next step, far from B", step: 11, now: early, want: cont},
		{name: "the last step the projection lets through", step: 17, now: early, want: cont},
		{name: "the projection reaches B", step: 18, now: early, want: save},
		{name: "one save since the anchor moves the fire a step earlier", step: 17, saves: 1, now: early, want: save},
		{name: "two saves still let step 16 through", step: 16, saves: 2, now: early, want: cont},
		{name: "three saves fire at step 16", step: 16, saves: 3, now: early, want: save},
		{name: "exactly B fires (>=, the coordinator's rule)", step: 17, now: early, want: save,
			mutate: func(d *v1.Decision) { d.Inputs.MustSaveBy = timestamppb.New(planT0.Add(57 * time.Second)) }},
		{name: "a hair after B continues", step: 17, now: early, want: cont,
			mutate: func(d *v1.Decision) {
				d.Inputs.MustSaveBy = timestamppb.New(planT0.Add(57*time.Second + time.Millisecond))
			}},
		{name: "emergency: the projection continues but the save no longer fits on the rank's clock", step: 11,
			now: planT0.Add(51 * time.Second), want: save, emergency: true},
		{name: "the rank's clock just short of the emergency", step: 11,
			now: planT0.Add(51*time.Second - time.Millisecond), want: cont},
		{name: "after an anchor that fired, stop", step: 11, now: early, want: stop,
			mutate: func(d *v1.Decision) { d.Action = save }},
		{name: "after an anchor that said stop, stop", step: 12, now: early, want: stop,
			mutate: func(d *v1.Decision) { d.Action = stop }},
		{name: "a safety save anchors like a continue", step: 11, now: early, want: cont,
			mutate: func(d *v1.Decision) { d.Action = v1.StepAction_STEP_ACTION_SAVE_AND_CONTINUE }},
		{name: "no deadline: continue, even on a late clock", step: 500, now: planT0.Add(time.Hour), want: cont,
			mutate: func(d *v1.Decision) { d.Inputs.MustSaveBy = nil }},
		{name: "the anchor's own step keeps its decision", step: 10, now: planT0.Add(time.Hour), want: save,
			mutate: func(d *v1.Decision) { d.Action = save }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := planOf(tc.mutate).decide(tc.step, tc.saves, tc.now)
			if got.action != tc.want || got.emergency != tc.emergency {
				t.Fatalf("step %d: %v (emergency %v), want %v (emergency %v): %s", tc.step, got.action, got.emergency, tc.want, tc.emergency, got.explanation)
			}
			if got.explanation == "" {
				t.Error("no explanation")
			}
		})
	}
}

// Two ranks that lost the coordinator after the same decision fire at the
// same step, however differently their own steps run: the projection reads
// nothing either measured, and neither clock comes near the emergency.
func TestLocalPlanTwoRanksAnchoredAlikeFireAtTheSameStep(t *testing.T) {
	fast := func(n int64) time.Time { return planT0.Add(time.Duration(n-10) * time.Second) }
	slow := func(n int64) time.Time { return planT0.Add(time.Duration(n-10) * 5 * time.Second) }
	for _, saves := range []int{0, 1, 3} {
		a, b := firstFire(t, planOf(nil), saves, fast), firstFire(t, planOf(nil), saves, slow)
		if a != b {
			t.Errorf("%d saves since the anchor: the fast rank fired at step %d, the slow one at %d", saves, a, b)
		}
	}
	// A rank anchored a step later (its last call got through) may fire
	// one step apart: the documented price, not a guarantee to hold.
	later := planOf(func(d *v1.Decision) { d.Step, d.DecidedAt = 11, timestamppb.New(planT0.Add(5*time.Second)) })
	if a, b := firstFire(t, planOf(nil), 0, fast), firstFire(t, later, 0, fast); b-a > 1 || a-b > 1 {
		t.Errorf("anchored one step apart, the ranks fired at steps %d and %d", a, b)
	}
}

// firstFire runs a rank's steps after the anchor by the plan until one
// says SAVE_AND_STOP, and returns it.
func firstFire(t *testing.T, p localPlan, saves int, clock func(step int64) time.Time) int64 {
	t.Helper()
	for n := p.step + 1; n < p.step+100; n++ {
		d := p.decide(n, saves, clock(n))
		if d.action == v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
			if d.emergency || !strings.HasPrefix(d.explanation, "projected") {
				t.Fatalf("step %d fired on the rank's clock: %s", n, d.explanation)
			}
			return n
		}
	}
	t.Fatal("the plan never fired")
	return 0
}
