package deadline

import (
	"math"
	"strings"
	"testing"
	"time"
)

var _ Policy = Max{}

func f64(v float64) *float64 { return &v }

func TestMaxEstimate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Observations
		want Estimates
	}{
		{"nothing recorded, no priors", Observations{}, Estimates{}},
		{"priors until measured",
			Observations{MaxIterationSeconds: 40, ExpectedCheckpointSeconds: f64(120), ExpectedSnapshotSeconds: f64(60), MarginSeconds: 30},
			Estimates{Iteration: 40, Checkpoint: 120, Reserve: 60, Margin: 30}},
		{"a measured checkpoint replaces the prior, even a smaller one",
			Observations{CheckpointSeconds: 20, CheckpointMeasured: true, ExpectedCheckpointSeconds: f64(120)},
			Estimates{Checkpoint: 20}},
		{"a measured zero-second checkpoint still replaces the prior",
			Observations{CheckpointSeconds: 0, CheckpointMeasured: true, ExpectedCheckpointSeconds: f64(120)},
			Estimates{Checkpoint: 0}},
		{"an unmeasured checkpoint value is ignored",
			Observations{CheckpointSeconds: 99, ExpectedCheckpointSeconds: f64(5)},
			Estimates{Checkpoint: 5}},
		{"saved snapshots replace the prior, even smaller ones",
			Observations{SavedSnapshotSeconds: []float64{3}, ExpectedSnapshotSeconds: f64(60)},
			Estimates{Reserve: 3}},
		{"R is the max of the window, wherever it sits",
			Observations{SavedSnapshotSeconds: []float64{4, 17.5, 2}},
			Estimates{Reserve: 17.5}},
		{"R is the max of the window, last",
			Observations{SavedSnapshotSeconds: []float64{4, 2, 9}},
			Estimates{Reserve: 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Max{}).Estimate(tc.o); got != tc.want {
				t.Errorf("Estimate = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestEstimatesSums(t *testing.T) {
	e := Estimates{Iteration: 1, Checkpoint: 2, Reserve: 4, Margin: 8}
	if e.Save() != 14*time.Second || e.Total() != 15*time.Second {
		t.Errorf("Save %v Total %v, want 14 s and 15 s", e.Save(), e.Total())
	}
	// As floats, 0.7 + 0.1 < 0.8, and 8.2 s truncated is 8.199999999 s.
	e = Estimates{Iteration: 0.7, Checkpoint: 0.1, Reserve: 8.2}
	if e.Save() != 8300*time.Millisecond || e.Total() != 9*time.Second {
		t.Errorf("Save %v Total %v, want 8.3 s and 9 s", e.Save(), e.Total())
	}
	huge := Estimates{Iteration: 1e300, Margin: 1e300}
	if huge.Total() != time.Duration(math.MaxInt64) {
		t.Errorf("Total of huge estimates = %v, want saturation", huge.Total())
	}
}

// A sum of decimal durations that lands on B exactly fires: the floats
// must not make it a nanosecond short.
func TestDecideAtBExactlyWithDecimals(t *testing.T) {
	b := time.Date(2026, 11, 30, 12, 0, 10, 0, time.UTC)
	now := b.Add(-10 * time.Second).Add(1800 * time.Millisecond)
	for _, est := range []Estimates{{Iteration: 8.2}, {Iteration: 7.4, Checkpoint: 0.7, Reserve: 0.1}} {
		if v := (Max{}).Decide(now, b, est); !v.Fire {
			t.Errorf("%+v from %s: did not fire (%s)", est, now.Format(time.RFC3339Nano), v.Explanation)
		}
		if got := (Max{}).FiresAt(b, est); !got.Equal(now) {
			t.Errorf("%+v: FiresAt %s, want %s", est, got.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
		}
	}
}

func TestDecideBoundary(t *testing.T) {
	b := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	est := Estimates{Iteration: 600, Checkpoint: 120, Reserve: 60, Margin: 30} // 810 s
	total := 810 * time.Second

	at := b.Add(-total)
	if v := (Max{}).Decide(at, b, est); !v.Fire {
		t.Errorf("now+I+C+R+M == B: did not fire (%s)", v.Explanation)
	} else if !strings.Contains(v.Explanation, ">= B") {
		t.Errorf("fire explanation %q", v.Explanation)
	}
	if v := (Max{}).Decide(at.Add(-time.Nanosecond), b, est); v.Fire {
		t.Errorf("now+I+C+R+M == B - 1ns: fired (%s)", v.Explanation)
	} else if !strings.Contains(v.Explanation, "< B") {
		t.Errorf("continue explanation %q", v.Explanation)
	}
	if v := (Max{}).Decide(b.Add(time.Hour), b, est); !v.Fire {
		t.Error("after B: did not fire")
	}
	if v := (Max{}).Decide(b.Add(-time.Hour), b, Estimates{}); v.Fire {
		t.Error("an hour before B with nothing to save: fired")
	}
}

func TestFiresAt(t *testing.T) {
	b := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	est := Estimates{Iteration: 600, Checkpoint: 120, Reserve: 60, Margin: 30}
	p := Max{}
	fa := p.FiresAt(b, est)
	if want := b.Add(-810 * time.Second); !fa.Equal(want) {
		t.Errorf("FiresAt = %v, want %v", fa, want)
	}
	// FiresAt is the earliest completion time at which Decide fires.
	if !p.Decide(fa, b, est).Fire || p.Decide(fa.Add(-time.Nanosecond), b, est).Fire {
		t.Error("FiresAt disagrees with Decide")
	}
	// Before the first step there is no iteration to wait for.
	if got, want := p.PreStepFiresAt(b, est), b.Add(-210*time.Second); !got.Equal(want) {
		t.Errorf("PreStepFiresAt = %v, want %v", got, want)
	}
	// Fractional seconds count.
	if got, want := p.PreStepFiresAt(b, Estimates{Reserve: 1.5}), b.Add(-1500*time.Millisecond); !got.Equal(want) {
		t.Errorf("PreStepFiresAt(R=1.5) = %v, want %v", got, want)
	}
}

func TestSecondsSaturates(t *testing.T) {
	if got := Seconds(1.25); got != 1250*time.Millisecond {
		t.Errorf("Seconds(1.25) = %v", got)
	}
	for _, s := range []float64{1e300, math.Inf(1), float64(math.MaxInt64)} {
		if got := Seconds(s); got != time.Duration(math.MaxInt64) {
			t.Errorf("Seconds(%g) = %v, want saturation", s, got)
		}
	}
}

// S is C, plus R when a snapshot follows each trainer checkpoint, and only
// at a step the trainer follows with a regular save.
func TestMaxEstimateRegularSave(t *testing.T) {
	base := Observations{MaxIterationSeconds: 40, ExpectedCheckpointSeconds: f64(120), SavedSnapshotSeconds: []float64{60}, MarginSeconds: 30}
	for _, tc := range []struct {
		name          string
		follows, snap bool
		want          Estimates
	}{
		{"no regular save", false, true, Estimates{Iteration: 40, Checkpoint: 120, Reserve: 60, Margin: 30}},
		{"checkpoint only", true, false, Estimates{Iteration: 40, Checkpoint: 120, Reserve: 60, Margin: 30, RegularSave: 120, RegularSaveFollows: true}},
		{"checkpoint and snapshot", true, true, Estimates{Iteration: 40, Checkpoint: 120, Reserve: 60, Margin: 30, RegularSave: 180, RegularSaveFollows: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			o.RegularSaveFollows, o.SnapshotFollowsCheckpoint = tc.follows, tc.snap
			if got := (Max{}).Estimate(o); got != tc.want {
				t.Errorf("Estimate = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The case of issue 15: 44 s to spare for the next iteration, but a
// regular save of 351 s runs before it. With S counted the step fires, its
// explanation names S, and FiresAt moves S earlier.
func TestDecideCountsRegularSave(t *testing.T) {
	b := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	est := Estimates{Iteration: 100, Checkpoint: 291, Reserve: 60, Margin: 30}
	now := b.Add(-est.Total() - 44*time.Second)
	if v := (Max{}).Decide(now, b, est); v.Fire || !strings.Contains(v.Explanation, "now+I+C+R+M") {
		t.Fatalf("without a regular save: fire %v, %q; want continue, I+C+R+M", v.Fire, v.Explanation)
	}
	est.RegularSave, est.RegularSaveFollows = 351, true
	v := (Max{}).Decide(now, b, est)
	if !v.Fire {
		t.Fatalf("with S = 351 s: continued (%s)", v.Explanation)
	}
	for _, want := range []string{"now+S+I+C+R+M", "(351 + 100 + 291 + 60 + 30 s)", "the regular save after this step is the deadline save"} {
		if !strings.Contains(v.Explanation, want) {
			t.Errorf("explanation %q does not say %q", v.Explanation, want)
		}
	}
	if got, want := (Max{}).FiresAt(b, est), b.Add(-(100+291+60+30+351)*time.Second); !got.Equal(want) {
		t.Errorf("FiresAt %s, want %s", got, want)
	}
	if got, want := (Max{}).PreStepFiresAt(b, est), b.Add(-(291+60+30)*time.Second); !got.Equal(want) {
		t.Errorf("PreStepFiresAt %s, want %s: no iteration, no regular save before the bootstrap save", got, want)
	}
}
