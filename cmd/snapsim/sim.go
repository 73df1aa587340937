package main

import (
	"time"

	"github.com/snapcoord/snapcoord/server/deadline"
)

// knowledge is what the coordinator knows when step k completes: the same
// for every policy, since a policy that continues changes nothing in the
// run.
type knowledge struct {
	w            *Workload
	maxIteration float64
	checkpoints  float64 // longest measured, for Max
	snapshots    []float64
	hist         deadline.History
}

// maxWindow is ReserveSpec.window's default: Max's R is the longest of the
// last 5 snapshots.
const maxWindow = 5

// epoch anchors the simulated seconds to wall-clock times for the policies.
var epoch = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return epoch.Add(deadline.Seconds(s)) }

func newKnowledge(w *Workload) *knowledge {
	k := &knowledge{w: w, hist: deadline.NewHistory()}
	k.hist.PriorCheckpointSeconds, k.hist.PriorSnapshotSeconds = w.PriorCheckpoint, w.PriorSnapshot
	k.hist.LastDurableSave = epoch
	return k
}

func (k *knowledge) stepDone(s Step) {
	k.maxIteration = max(k.maxIteration, s.Iteration)
	k.hist.Iterations.Push(s.Iteration)
}

func (k *knowledge) saved(s Step) {
	k.checkpoints = max(k.checkpoints, s.Checkpoint)
	k.snapshots = append(k.snapshots, s.Snapshot)
	if len(k.snapshots) > maxWindow {
		k.snapshots = k.snapshots[1:]
	}
	k.hist.Checkpoints.Push(s.Checkpoint)
	k.hist.Snapshots.Push(s.Snapshot)
	k.hist.LastDurableSave = at(s.Done + s.save())
}

// policy decides at a completed step whether to fire.
type policy interface {
	name() string
	fire(k *knowledge, s Step) bool
}

// maxPolicy is deadline.Max with margin M; withSave adds the regular save
// that follows a step to its look-ahead (issue 15, part 1).
type maxPolicy struct {
	margin   float64
	withSave bool
}

func (p maxPolicy) name() string {
	if p.withSave {
		return "Max + regular save"
	}
	return "Max (main)"
}

func (p maxPolicy) fire(k *knowledge, s Step) bool {
	o := deadline.Observations{
		MaxIterationSeconds:       k.maxIteration,
		CheckpointSeconds:         k.checkpoints,
		CheckpointMeasured:        k.hist.Checkpoints.Len() > 0,
		ExpectedCheckpointSeconds: &k.w.PriorCheckpoint,
		SavedSnapshotSeconds:      k.snapshots,
		ExpectedSnapshotSeconds:   &k.w.PriorSnapshot,
		MarginSeconds:             p.margin,
	}
	est := deadline.Max{}.Estimate(o)
	now := at(s.Done)
	if p.withSave && s.RegularSave {
		now = now.Add(deadline.Seconds(est.Checkpoint + est.Reserve))
	}
	return deadline.Max{}.Decide(now, at(k.w.Walltime), est).Fire
}

// lossPolicy is deadline.ExpectedLoss with margin M.
type lossPolicy struct {
	label  string
	margin float64
	p      deadline.ExpectedLoss
}

func (p lossPolicy) name() string { return p.label }

func (p lossPolicy) fire(k *knowledge, s Step) bool {
	h := k.hist
	h.MarginSeconds = p.margin
	return p.p.Assess(at(s.Done), at(k.w.Walltime), s.RegularSave, &h).Fire
}

// outcome is how a run ended under a policy: Waste is the walltime left
// unused after the final save, or on a miss everything since the last
// durable save (seconds).
type outcome struct {
	Waste float64
	Miss  bool
}

// simulate runs every policy over the same run and returns their outcomes,
// in order.
func simulate(w *Workload, steps []Step, policies []policy) []outcome {
	out := make([]outcome, len(policies))
	done := make([]bool, len(policies))
	left := len(policies)
	k := newKnowledge(w)
	lastDurable := 0.0
	for _, s := range steps {
		k.stepDone(s)
		for i, p := range policies {
			if done[i] || !p.fire(k, s) {
				continue
			}
			out[i] = finalSave(w, s, lastDurable)
			done[i] = true
			left--
		}
		if left == 0 {
			return out
		}
		if s.RegularSave {
			if s.Done+s.save() > w.Walltime {
				break // killed during the regular save
			}
			lastDurable = s.Done + s.save()
			k.saved(s)
		}
	}
	for i := range out {
		if !done[i] {
			out[i] = outcome{Waste: w.Walltime - lastDurable, Miss: true}
		}
	}
	return out
}

// finalSave is the outcome of the deadline save after step s.
func finalSave(w *Workload, s Step, lastDurable float64) outcome {
	if end := s.Done + s.save(); end <= w.Walltime {
		return outcome{Waste: w.Walltime - end}
	}
	return outcome{Waste: w.Walltime - lastDurable, Miss: true}
}

// oracle knows every duration: it fires at the step whose save wastes
// least.
func oracle(w *Workload, steps []Step) outcome {
	lastDurable := 0.0
	best := outcome{Waste: w.Walltime, Miss: true}
	for _, s := range steps {
		if o := finalSave(w, s, lastDurable); o.Waste < best.Waste {
			best = o
		}
		if s.RegularSave {
			if s.Done+s.save() > w.Walltime {
				break
			}
			lastDurable = s.Done + s.save()
		}
	}
	if o := (outcome{Waste: w.Walltime - lastDurable, Miss: true}); o.Waste < best.Waste {
		best = o
	}
	return best
}
