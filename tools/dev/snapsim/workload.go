package main

import (
	"math"
	"math/rand/v2"
)

// Workload is one kind of training run, as issue 15 specifies them.
type Workload struct {
	Name, About string
	// Walltime is B, seconds from the run's start.
	Walltime float64
	// Mean durations, seconds.
	Iteration, Checkpoint, Snapshot float64
	// SaveEvery: a regular checkpoint and snapshot after every SaveEvery-th
	// step.
	SaveEvery int
	// Drift: the mean iteration grows by this fraction over the walltime.
	Drift float64
	// BimodalSnapshots: 70 % of snapshots take about 60 s, 30 % about 300 s
	// (Snapshot is ignored).
	BimodalSnapshots bool
	// Priors the run's spec gives for C and R.
	PriorCheckpoint, PriorSnapshot float64
}

// baseA is workload A; the others change one or two things in it.
var baseA = Workload{
	Walltime: 4 * 3600, Iteration: 300, Checkpoint: 120, Snapshot: 60, SaveEvery: 10,
	PriorCheckpoint: 120, PriorSnapshot: 60,
}

func workloads() []Workload {
	with := func(name, about string, change func(w *Workload)) Workload {
		w := baseA
		w.Name, w.About = name, about
		change(&w)
		return w
	}
	c := func(w *Workload) {
		w.Checkpoint, w.Snapshot, w.PriorCheckpoint, w.PriorSnapshot = 400, 180, 400, 180
	}
	return []Workload{
		with("A", "4 h, I 300 s, C 120 s, R 60 s, a regular save every 10 steps", func(*Workload) {}),
		with("B", "as A, R 240 s", func(w *Workload) { w.Snapshot, w.PriorSnapshot = 240, 240 }),
		with("C", "as A, C 400 s, R 180 s", c),
		with("D", "as A, iterations drifting up 30 % over the walltime", func(w *Workload) { w.Drift = 0.3 }),
		with("E", "as A, snapshots 70 % ~60 s / 30 % ~300 s", func(w *Workload) {
			w.BimodalSnapshots, w.PriorSnapshot = true, 0.7*60+0.3*300
		}),
		with("F", "as C, the prior for C 133 s (3× too small)", func(w *Workload) { c(w); w.PriorCheckpoint = 133 }),
		with("G", "as A, 1 h walltime, I 120 s", func(w *Workload) { w.Walltime, w.Iteration = 3600, 120 }),
		with("H", "as A, a regular save every 50 steps", func(w *Workload) { w.SaveEvery = 50 }),
	}
}

// Step is one step of a run that never stops early: it completes at Done
// (seconds from the start); a save after it (regular or the deadline's)
// takes Checkpoint + Snapshot.
type Step struct {
	Iteration, Done      float64
	Checkpoint, Snapshot float64
	RegularSave          bool
}

func (s Step) save() float64 { return s.Checkpoint + s.Snapshot }

// trajectory draws a run's steps: every one that completes before the
// walltime if the run never stops early. Deciding to continue changes
// nothing in it, so every policy (and the oracle) sees the same run and
// differs only in the step it fires at.
func (w Workload) trajectory(rng *rand.Rand) []Step {
	var steps []Step
	t := 0.0
	for k := 1; ; k++ {
		mean := w.Iteration * (1 + w.Drift*t/w.Walltime)
		it := mean * lognormal(rng, 0.12)
		if k == 1 {
			it *= 2
		}
		if rng.Float64() < 0.05 {
			it *= uniform(rng, 1.4, 2.2)
		}
		st := Step{Iteration: it, Done: t + it, RegularSave: k%w.SaveEvery == 0}
		st.Checkpoint = w.Checkpoint * lognormal(rng, 0.2)
		if rng.Float64() < 0.05 {
			st.Checkpoint *= uniform(rng, 2, 3)
		}
		snap := w.Snapshot
		if w.BimodalSnapshots {
			snap = 60
			if rng.Float64() < 0.3 {
				snap = 300
			}
		}
		st.Snapshot = snap * lognormal(rng, 0.3)
		if st.Done >= w.Walltime {
			return steps
		}
		steps = append(steps, st)
		t = st.Done
		if st.RegularSave {
			t += st.save()
		}
	}
}

// lognormal is a lognormal factor of mean 1 and log-spread sigma.
func lognormal(rng *rand.Rand, sigma float64) float64 {
	return math.Exp(sigma*rng.NormFloat64() - sigma*sigma/2)
}

func uniform(rng *rand.Rand, lo, hi float64) float64 { return lo + (hi-lo)*rng.Float64() }
