package deadline

import (
	"slices"
	"testing"
	"unsafe"
)

func TestRingKeepsTheLatestValuesOldestFirst(t *testing.T) {
	r := NewRing(3)
	for v := range 10 {
		r.Push(float64(v))
	}
	if got := r.Values(); !slices.Equal(got, []float64{7, 8, 9}) {
		t.Errorf("after pushing 0..9 into a ring of 3: %v, want [7 8 9]", got)
	}
	if r.Len() != 3 || r.Cap() != 3 {
		t.Errorf("Len %d Cap %d, want 3 and 3", r.Len(), r.Cap())
	}
}

func TestRingIsBounded(t *testing.T) {
	for _, c := range []struct{ asked, want int }{{0, 1}, {-5, 1}, {8, 8}, {32, 32}, {1000, RingCapacity}} {
		r := NewRing(c.asked)
		for v := range 100_000 {
			r.Push(float64(v))
		}
		if r.Cap() != c.want || r.Len() != c.want {
			t.Errorf("NewRing(%d) after 100,000 pushes: Cap %d Len %d, want %d", c.asked, r.Cap(), r.Len(), c.want)
		}
		if last := r.At(r.Len() - 1); last != 99_999 {
			t.Errorf("NewRing(%d): newest value %v, want 99999", c.asked, last)
		}
	}
	// The size of a run's history does not depend on how long it ran: a
	// fixed number of bytes, whatever was pushed.
	if size := unsafe.Sizeof(History{}); size > 1024 {
		t.Errorf("History is %d bytes, want at most 1 KiB", size)
	}
}

func TestRingZeroValueHoldsRingCapacity(t *testing.T) {
	var r Ring
	for v := range 40 {
		r.Push(float64(v))
	}
	if r.Len() != RingCapacity || r.At(0) != 8 {
		t.Errorf("zero Ring after 40 pushes: Len %d oldest %v, want %d and 8", r.Len(), r.At(0), RingCapacity)
	}
}

func TestNewRingRestoresPersistedValues(t *testing.T) {
	r := NewRing(CheckpointHistory, 1, 2, 3)
	restored := NewRing(CheckpointHistory, r.Values()...)
	if !slices.Equal(restored.Values(), []float64{1, 2, 3}) {
		t.Errorf("restored %v, want [1 2 3]", restored.Values())
	}
	// NewRing with more values than fit keeps the newest.
	two := NewRing(2, 1, 2, 3)
	if got := two.Values(); !slices.Equal(got, []float64{2, 3}) {
		t.Errorf("NewRing(2, 1, 2, 3) = %v, want [2 3]", got)
	}
}

func TestHistoryIsAValue(t *testing.T) {
	h := NewHistory()
	h.Iterations.Push(10)
	c := h
	c.Iterations.Push(20)
	if h.Iterations.Len() != 1 || c.Iterations.Len() != 2 {
		t.Errorf("a copy shares its ring with the original: %v and %v", h.Iterations.Values(), c.Iterations.Values())
	}
	if h.Iterations.Cap() != IterationHistory || h.Checkpoints.Cap() != CheckpointHistory || h.Snapshots.Cap() != SnapshotHistory {
		t.Errorf("NewHistory capacities %d %d %d", h.Iterations.Cap(), h.Checkpoints.Cap(), h.Snapshots.Cap())
	}
}
