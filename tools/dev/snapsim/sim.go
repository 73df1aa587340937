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

// saved records a save after step s that became durable at end.
func (k *knowledge) saved(s Step, end float64) {
	k.checkpoints = max(k.checkpoints, s.Checkpoint)
	k.snapshots = append(k.snapshots, s.Snapshot)
	if len(k.snapshots) > maxWindow {
		k.snapshots = k.snapshots[1:]
	}
	k.hist.Checkpoints.Push(s.Checkpoint)
	k.hist.Snapshots.Push(s.Snapshot)
	k.hist.LastDurableSave = at(end)
}

// verdict is a policy's answer at a completed step.
type verdict int

const (
	proceed    verdict = iota // continue
	fire                      // save now and stop
	safetySave                // save now and continue
)

// policy decides at step s, completed at now (seconds from the start).
type policy interface {
	name() string
	decide(k *knowledge, now float64, s Step) verdict
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

func (p maxPolicy) decide(k *knowledge, now float64, s Step) verdict {
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
	t := at(now)
	if p.withSave && s.RegularSave {
		t = t.Add(deadline.Seconds(est.Checkpoint + est.Reserve))
	}
	if (deadline.Max{}).Decide(t, at(k.w.Walltime), est).Fire {
		return fire
	}
	return proceed
}

// lossPolicy is deadline.ExpectedLoss with margin M.
type lossPolicy struct {
	label  string
	margin float64
	p      deadline.ExpectedLoss
}

func (p lossPolicy) name() string { return p.label }

func (p lossPolicy) decide(k *knowledge, now float64, s Step) verdict {
	h := k.hist
	h.MarginSeconds = p.margin
	a := p.p.Assess(at(now), at(k.w.Walltime), s.RegularSave, &h)
	switch {
	case a.Fire:
		return fire
	case a.SafetySave:
		return safetySave
	}
	return proceed
}

// outcome is how a run ended under a policy: Waste is the walltime left
// unused after the final save, or on a miss everything since the last
// durable save (seconds); Safety is the time spent in safety saves, which
// the honest count adds.
type outcome struct {
	Waste, Safety float64
	Miss          bool
}

// simulate runs policy p over the run's steps. A safety save delays every
// later step by its duration (the step's own save durations), so each
// policy has its own clock over the same draws.
func simulate(w *Workload, steps []Step, p policy) outcome {
	k := newKnowledge(w)
	t, lastDurable, safety := 0.0, 0.0, 0.0
	for _, s := range steps {
		t += s.Iteration
		if t >= w.Walltime {
			break
		}
		k.stepDone(s)
		v := p.decide(k, t, s)
		if v == fire {
			o := finalSave(w, t, s, lastDurable)
			o.Safety = safety
			return o
		}
		if !s.RegularSave && v != safetySave {
			continue
		}
		if t+s.save() > w.Walltime {
			break // killed during the save
		}
		if !s.RegularSave {
			safety += s.save()
		}
		t += s.save()
		lastDurable = t
		k.saved(s, t)
	}
	return outcome{Waste: w.Walltime - lastDurable, Safety: safety, Miss: true}
}

// finalSave is the outcome of the deadline save after step s.
func finalSave(w *Workload, done float64, s Step, lastDurable float64) outcome {
	if end := done + s.save(); end <= w.Walltime {
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
		if o := finalSave(w, s.Done, s, lastDurable); o.Waste < best.Waste {
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
