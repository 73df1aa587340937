// Package deadline holds the save rule of DESIGN.md: the estimates I, C, R, M
// and the decision now + I + C + R + M >= B; at a step the trainer follows
// with a regular save, now + S + I + C + R + M >= B. It is pure (no clock,
// no I/O) and sits behind the Policy interface so that a risk-aware rule
// (quantiles of the recorded durations instead of maxima) can replace it
// without touching the engine.
package deadline

import (
	"fmt"
	"math"
	"time"
)

// Observations is what the coordinator has recorded for a run.
type Observations struct {
	// MaxIterationSeconds is the longest iteration recorded (per step, the
	// max over ranks).
	MaxIterationSeconds float64
	// CheckpointSeconds is the longest trainer-checkpoint save recorded;
	// meaningful only when CheckpointMeasured.
	CheckpointSeconds  float64
	CheckpointMeasured bool
	// ExpectedCheckpointSeconds is the spec's prior for C, if any.
	ExpectedCheckpointSeconds *float64
	// SavedSnapshotSeconds are the durations of the most recent SAVED
	// snapshots, oldest first (at most the reserve window).
	SavedSnapshotSeconds []float64
	// ExpectedSnapshotSeconds is the spec's prior for R, if any.
	ExpectedSnapshotSeconds *float64
	// MarginSeconds is M.
	MarginSeconds float64
	// RegularSaveFollows: the trainer saves a regular checkpoint after the
	// step decided, before its next iteration (checkpoint_every_steps).
	RegularSaveFollows bool
	// SnapshotFollowsCheckpoint: an environment snapshot follows each
	// trainer checkpoint, so a regular save also holds up the next
	// iteration's rollouts for R.
	SnapshotFollowsCheckpoint bool
	// History holds the bounded histories the expected-loss policy decides
	// from; Max ignores it, and the engine fills it only for a policy that
	// reads it. Nil: nothing recorded.
	History *History
}

// Estimates are the inputs of a decision, in seconds.
type Estimates struct {
	Iteration, Checkpoint, Reserve, Margin float64
	// RegularSave is S, the regular save that follows the step before the
	// next iteration; meaningful only when RegularSaveFollows.
	RegularSave        float64
	RegularSaveFollows bool
}

// Save is C + R + M: how long the save at a fired step is expected to take,
// margin included.
func (e Estimates) Save() time.Duration { return sum(e.Checkpoint, e.Reserve, e.Margin) }

// Total is S + I + C + R + M: from a step's decision to the end of the
// deadline save at the next step, margin included. S is 0 unless a regular
// save follows the step.
func (e Estimates) Total() time.Duration {
	return sum(e.RegularSave, e.Iteration, e.Checkpoint, e.Reserve, e.Margin)
}

// sum adds the terms as durations, each rounded to the nanosecond first,
// saturating. Added as floats they can come out a nanosecond short (0.7 +
// 0.1 < 0.8): at now + I + C + R + M exactly B, the rule would continue
// where it must save.
func sum(terms ...float64) time.Duration {
	var d time.Duration
	for _, s := range terms {
		t := Seconds(s)
		if d > math.MaxInt64-t {
			return time.Duration(math.MaxInt64)
		}
		d += t
	}
	return d
}

// Verdict is the outcome of the rule for one completed step.
type Verdict struct {
	Fire bool
	// SafetySave: continue, but save first (ExpectedLoss with SafetySaves;
	// never with Fire).
	SafetySave  bool
	Explanation string
	// Loss holds the expected-loss figures when the policy weighed them
	// (ExpectedLoss, short of the worst case fitting); nil otherwise.
	Loss *Loss
}

// Loss is what the expected-loss policy weighed at a step: the expected
// loss, seconds, of saving now and of saving after one more step, and the
// probability that each misses B − M.
type Loss struct {
	NowSeconds, NextSeconds float64
	MissNow, MissNext       float64
	// SafetySeconds: a safety save now, then one more step; meaningful
	// only when Safety (the policy weighed one).
	SafetySeconds float64
	Safety        bool
}

// Policy turns observations into estimates and decisions.
type Policy interface {
	// Estimate gives the estimates Run.deadline shows, and FiresAt and
	// PreStepFiresAt work from.
	Estimate(o Observations) Estimates
	// Judge applies the rule at a completed step; est is Estimate(o).
	Judge(now, mustSaveBy time.Time, o Observations, est Estimates) Verdict
	// FiresAt is the earliest completion time at which Judge can fire.
	FiresAt(mustSaveBy time.Time, est Estimates) time.Time
	// PreStepFiresAt is when, with no step completed yet, the bootstrap
	// state must be saved: there is no iteration to wait for.
	PreStepFiresAt(mustSaveBy time.Time, est Estimates) time.Time
}

// Max is the rule of DESIGN.md: every estimate is the largest duration
// recorded so far ("a single slow iteration cannot run past the deadline").
type Max struct{}

// Estimate implements Policy.
func (Max) Estimate(o Observations) Estimates {
	est := Estimates{Iteration: o.MaxIterationSeconds, Margin: o.MarginSeconds}
	switch {
	case o.CheckpointMeasured:
		est.Checkpoint = o.CheckpointSeconds
	case o.ExpectedCheckpointSeconds != nil:
		est.Checkpoint = *o.ExpectedCheckpointSeconds
	}
	switch {
	case len(o.SavedSnapshotSeconds) > 0:
		for _, s := range o.SavedSnapshotSeconds {
			est.Reserve = math.Max(est.Reserve, s)
		}
	case o.ExpectedSnapshotSeconds != nil:
		est.Reserve = *o.ExpectedSnapshotSeconds
	}
	return WithRegularSave(o, est)
}

// WithRegularSave sets S from est's C and R when o says a regular save
// follows the step: the trainer's checkpoint (C) holds up the next
// iteration, and so does the environment snapshot that follows it (R),
// since the environment workers save before they serve that iteration's
// rollouts. A policy that estimates C and R its own way calls it last.
func WithRegularSave(o Observations, est Estimates) Estimates {
	est.RegularSave, est.RegularSaveFollows = 0, o.RegularSaveFollows
	if !o.RegularSaveFollows {
		return est
	}
	est.RegularSave = est.Checkpoint
	if o.SnapshotFollowsCheckpoint {
		est.RegularSave += est.Reserve
	}
	return est
}

// Decide implements Policy.
func (p Max) Decide(now, mustSaveBy time.Time, est Estimates) Verdict {
	end := now.Add(est.Total())
	terms := fmt.Sprintf("now+%s = %s + %s = %s", names(est), stamp(now), terms(est), stamp(end))
	if end.Before(mustSaveBy) {
		return Verdict{Explanation: fmt.Sprintf("%s < B = %s: continue, %s to spare",
			terms, stamp(mustSaveBy), mustSaveBy.Sub(end).Round(time.Second))}
	}
	stop := "save now and stop"
	if est.RegularSaveFollows {
		stop += " (the regular save after this step is the deadline save)"
	}
	return Verdict{Fire: true, Explanation: fmt.Sprintf("%s >= B = %s: %s",
		terms, stamp(mustSaveBy), stop)}
}

// Judge implements Policy: Max decides from the estimates alone.
func (p Max) Judge(now, mustSaveBy time.Time, _ Observations, est Estimates) Verdict {
	return p.Decide(now, mustSaveBy, est)
}

// FiresAt implements Policy: Max fires exactly from then on.
func (Max) FiresAt(mustSaveBy time.Time, est Estimates) time.Time {
	return mustSaveBy.Add(-est.Total())
}

// PreStepFiresAt implements Policy.
func (Max) PreStepFiresAt(mustSaveBy time.Time, est Estimates) time.Time {
	return mustSaveBy.Add(-est.Save())
}

// Seconds converts float seconds to a Duration, rounded to the nanosecond
// (truncated, 8.2 s would be 8.199999999 s), saturating instead of
// overflowing for absurd values.
func Seconds(s float64) time.Duration {
	const maxSeconds = float64(math.MaxInt64 / int64(time.Second))
	if s >= maxSeconds {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(math.Round(s * float64(time.Second)))
}

// names are the terms Total adds, S only when a regular save follows.
func names(e Estimates) string {
	if e.RegularSaveFollows {
		return "S+I+C+R+M"
	}
	return "I+C+R+M"
}

func terms(e Estimates) string {
	if e.RegularSaveFollows {
		return fmt.Sprintf("(%s + %s + %s + %s + %s s)", num(e.RegularSave), num(e.Iteration), num(e.Checkpoint), num(e.Reserve), num(e.Margin))
	}
	return fmt.Sprintf("(%s + %s + %s + %s s)", num(e.Iteration), num(e.Checkpoint), num(e.Reserve), num(e.Margin))
}

func num(f float64) string { return fmt.Sprintf("%g", math.Round(f*1000)/1000) }

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
