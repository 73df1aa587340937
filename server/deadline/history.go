package deadline

import "time"

// RingCapacity is the most durations a Ring holds: the iteration history of
// the expected-loss policy. Rings of checkpoints and snapshots use less.
const RingCapacity = 32

// History capacities: the look-ahead needs enough iterations to see a slow
// one in twenty, the saves only a level and a spread.
const (
	IterationHistory  = RingCapacity
	CheckpointHistory = 8
	SnapshotHistory   = 8
)

// Ring keeps the most recent durations (seconds) in a fixed array, so a
// run's history costs the same at step 10 and at step 100,000, and copying
// it copies no shared slice. The zero Ring holds nothing and has capacity
// RingCapacity.
type Ring struct {
	vals  [RingCapacity]float64
	start uint8 // index of the oldest value
	n     uint8 // values held
	limit uint8 // capacity; 0 means RingCapacity
}

// NewRing returns an empty ring that holds at most capacity values (clamped
// to 1..RingCapacity), then pushes vals, oldest first: the engine restores a
// persisted history with NewRing(cap, stored...).
func NewRing(capacity int, vals ...float64) Ring {
	r := Ring{limit: uint8(min(max(capacity, 1), RingCapacity))}
	for _, v := range vals {
		r.Push(v)
	}
	return r
}

// Cap is the most values r holds.
func (r *Ring) Cap() int {
	if r.limit == 0 {
		return RingCapacity
	}
	return int(r.limit)
}

// Len is the number of values held.
func (r *Ring) Len() int { return int(r.n) }

// Push appends v, dropping the oldest value when r is full.
func (r *Ring) Push(v float64) {
	c := r.Cap()
	if int(r.n) < c {
		r.vals[(int(r.start)+int(r.n))%c] = v
		r.n++
		return
	}
	r.vals[r.start] = v
	r.start = uint8((int(r.start) + 1) % c)
}

// At is the i-th value held, oldest first.
func (r *Ring) At(i int) float64 { return r.vals[(int(r.start)+i)%r.Cap()] }

// Values copies the values out, oldest first (what the engine persists).
func (r *Ring) Values() []float64 {
	out := make([]float64, r.n)
	for i := range out {
		out[i] = r.At(i)
	}
	return out
}

// History is what the expected-loss policy decides from: bounded windows of
// the durations recorded for a run, the priors, and how much work a miss
// would lose. It is a plain value, a few hundred bytes, that the engine can
// keep in its run record and persist with it.
type History struct {
	// Iterations: the latest iteration durations (per step, the max over
	// ranks), capacity IterationHistory.
	Iterations Ring
	// Checkpoints and Snapshots: the latest measured trainer-checkpoint and
	// SAVED snapshot durations, capacity CheckpointHistory and
	// SnapshotHistory.
	Checkpoints, Snapshots Ring
	// Priors for C and R from the spec (0: none), used only until the first
	// measurement.
	PriorCheckpointSeconds, PriorSnapshotSeconds float64
	// MarginSeconds is M: the policy plans to finish the save by B - M.
	MarginSeconds float64
	// LastDurableSave is when the newest state that a restart could resume
	// from became durable (its checkpoint published and its snapshot
	// SAVED), or when the run started: a miss loses everything since.
	LastDurableSave time.Time
}

// NewHistory returns an empty history with the policy's capacities.
func NewHistory() History {
	return History{
		Iterations:  NewRing(IterationHistory),
		Checkpoints: NewRing(CheckpointHistory),
		Snapshots:   NewRing(SnapshotHistory),
	}
}
