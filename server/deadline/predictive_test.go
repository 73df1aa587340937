package deadline

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// checkDist checks what every distribution must be: sorted, with
// probabilities summing to 1 and prefix sums that match the points.
func checkDist(t *testing.T, s *support) {
	t.Helper()
	if !near(s.cumP[s.n], 1) {
		t.Errorf("probabilities sum to %v, want 1", s.cumP[s.n])
	}
	mean := 0.0
	for i := range s.n {
		if i > 0 && s.v[i] < s.v[i-1] {
			t.Errorf("points not sorted: %v", s.v[:s.n])
		}
		mean += s.p[i] * s.v[i]
	}
	if !near(s.mean(), mean) {
		t.Errorf("mean from prefix sums %v, from the points %v", s.mean(), mean)
	}
}

func TestBodyQuantilesAreEquallyLikelyNormalPoints(t *testing.T) {
	for i, z := range bodyQuantiles {
		q := (float64(i) + 0.5) / float64(len(bodyQuantiles))
		if want := math.Sqrt2 * math.Erfinv(2*q-1); !near(z, want) {
			t.Errorf("bodyQuantiles[%d] = %v, want Φ⁻¹(%v) = %v", i, z, q, want)
		}
	}
}

func TestSavePriorOnlyUntilTheFirstMeasurement(t *testing.T) {
	empty := NewRing(CheckpointHistory)
	m := modelSave(&empty, 120)
	if m.level != 120 || m.spread != minLogSpread || m.pStall != stallPrior || m.stall != 300 || m.measured != 0 {
		t.Errorf("no measurement, prior 120 s: %+v, want level 120, spread %v, stall 5 %% at 300 s", m, minLogSpread)
	}
	// One measurement, even far below the prior, replaces it.
	one := NewRing(CheckpointHistory, 40)
	if m := modelSave(&one, 120); m.level != 40 || m.measured != 1 {
		t.Errorf("one 40 s measurement, prior 120 s: level %v, want 40", m.level)
	}
	// A measured zero too: the save is instant, not unknown.
	zero := NewRing(CheckpointHistory, 0)
	if d := modelSave(&zero, 120).dist(); d.hi() != 0 {
		t.Errorf("a measured 0 s save with a prior of 120 s: longest %v, want 0", d.hi())
	}
	// No prior and nothing measured: the save is taken as instant, as Max
	// takes C = 0.
	if d := modelSave(&empty, 0).dist(); d.n != 1 || d.hi() != 0 {
		t.Errorf("no prior, nothing measured: %v, want a single point at 0", d.v[:d.n])
	}
}

func TestSaveLevelIsTheLowerMedian(t *testing.T) {
	r := NewRing(CheckpointHistory, 100, 130, 110, 120)
	if m := modelSave(&r, 0); m.level != 110 {
		t.Errorf("level of [100 130 110 120] = %v, want the lower median 110", m.level)
	}
	// The window holds only the latest 8: the old slow saves are gone.
	r = NewRing(CheckpointHistory, 900, 900, 900, 900, 900, 100, 100, 100, 100, 100, 100, 100, 100)
	if m := modelSave(&r, 0); m.level != 100 {
		t.Errorf("level after five 900 s saves and eight 100 s ones = %v, want 100", m.level)
	}
}

func TestSaveSpread(t *testing.T) {
	tight := NewRing(CheckpointHistory, 100, 101, 99, 100)
	if m := modelSave(&tight, 0); m.spread != minLogSpread {
		t.Errorf("spread of nearly equal saves = %v, want the floor %v", m.spread, minLogSpread)
	}
	wide := NewRing(CheckpointHistory, 100, 70, 145, 100)
	want := math.Sqrt((math.Log(0.7)*math.Log(0.7) + math.Log(1.45)*math.Log(1.45)) / 4)
	if m := modelSave(&wide, 0); !near(m.spread, want) {
		t.Errorf("spread of [100 70 145 100] = %v, want %v", m.spread, want)
	}
	// A very fast save (below level / 1.6) says nothing about slow ones and
	// does not widen the body.
	fast := NewRing(SnapshotHistory, 300, 310, 20, 305)
	if m := modelSave(&fast, 0); m.level != 300 || m.spread != minLogSpread {
		t.Errorf("[300 310 20 305]: level %v spread %v, want 300 and %v", m.level, m.spread, minLogSpread)
	}
}

func TestStallsUpdateTheStallComponent(t *testing.T) {
	calm := NewRing(CheckpointHistory, 100, 100, 100, 100, 100, 100, 100, 100)
	m := modelSave(&calm, 0)
	if m.pStall != stallPrior || m.stall != stallFactor*100 {
		t.Errorf("no stall in 8 saves: P %v at %v s, want the prior %v at 250 s (never below it)", m.pStall, m.stall, stallPrior)
	}
	// Two saves above 1.6 × the level are stalls; the longest moves the
	// stall point beyond 2.5 ×.
	stalled := NewRing(CheckpointHistory, 100, 100, 100, 100, 100, 100, 170, 320)
	m = modelSave(&stalled, 0)
	wantP := (stallPrior*stallPriorWeight + 2) / (stallPriorWeight + 8)
	if !near(m.pStall, wantP) || m.stall != 320 {
		t.Errorf("two stalls in 8: P %v at %v s, want %v at 320 s", m.pStall, m.stall, wantP)
	}
	if m.spread != minLogSpread {
		t.Errorf("stalls widened the body: spread %v", m.spread)
	}
	d := m.dist()
	checkDist(t, &d)
	if d.n != saveBody || d.hi() != 320 || !near(d.p[d.n-1], wantP) {
		t.Errorf("distribution %v / %v: want %d points, the last 320 s with P %v", d.v[:d.n], d.p[:d.n], saveBody, wantP)
	}
	// The body is the lognormal's points around the level.
	for i, z := range bodyQuantiles {
		if want := 100 * math.Exp(minLogSpread*z); !near(d.v[i], want) {
			t.Errorf("body point %d = %v, want %v", i, d.v[i], want)
		}
	}
}

func TestConvolution(t *testing.T) {
	cr := NewRing(CheckpointHistory, 100, 110, 120)
	rr := NewRing(SnapshotHistory, 50, 60, 200)
	c, r := modelSave(&cr, 0).dist(), modelSave(&rr, 0).dist()
	d := convolve(&c, &r)
	checkDist(t, &d)
	if d.n != c.n*r.n {
		t.Errorf("D has %d points, want %d", d.n, c.n*r.n)
	}
	if !near(d.mean(), c.mean()+r.mean()) || !near(d.hi(), c.hi()+r.hi()) || !near(d.lo(), c.lo()+r.lo()) {
		t.Errorf("D: mean %v lo %v hi %v; C + R: %v %v %v", d.mean(), d.lo(), d.hi(), c.mean()+r.mean(), c.lo()+r.lo(), c.hi()+r.hi())
	}
	// P(D ≤ y) and E[D; D ≤ y] at the extremes.
	if p, m := d.upTo(d.hi()); !near(p, 1) || !near(m, d.mean()) {
		t.Errorf("upTo(max) = %v, %v; want 1 and the mean", p, m)
	}
	if p, m := d.upTo(d.lo() - 1); p != 0 || m != 0 {
		t.Errorf("upTo(below min) = %v, %v; want 0, 0", p, m)
	}
}

func TestIterationDistribution(t *testing.T) {
	r := NewRing(IterationHistory, 300, 280, 320)
	d := iterationDist(&r)
	checkDist(t, &d)
	if d.n != 4 || d.hi() != tailFactor*320 || d.p[0] != 0.25 {
		t.Errorf("3 iterations: %v / %v, want them and %v × 320 s, each 1/4", d.v[:d.n], d.p[:d.n], tailFactor)
	}
	// Too few for a drift: none.
	if s := drift(&r); s != 1 {
		t.Errorf("drift of 3 iterations = %v, want 1", s)
	}
	steady := NewRing(IterationHistory)
	rising := NewRing(IterationHistory)
	for i := range 32 {
		steady.Push(300 + float64(i%3))
		rising.Push(300 * (1 + 0.01*float64(i)))
	}
	if s := drift(&steady); math.Abs(s-1) > 0.01 {
		t.Errorf("drift of a steady run = %v, want about 1", s)
	}
	// The latest 8 have a median at step 27.5 of 32, the window at 15.5:
	// about 12 % slower.
	if s := drift(&rising); s < 1.08 || s > 1.12 {
		t.Errorf("drift of iterations slowing 1 %% a step = %v, want about 1.1", s)
	}
	d = iterationDist(&rising)
	if want := tailFactor * 300 * 1.31 * drift(&rising); !near(d.hi(), want) {
		t.Errorf("the tail point of a drifting run = %v, want %v (scaled by the drift)", d.hi(), want)
	}
	// A wild jump is clamped.
	jump := NewRing(IterationHistory)
	for i := range 32 {
		v := 100.0
		if i >= 24 {
			v = 1000
		}
		jump.Push(v)
	}
	if s := drift(&jump); s != driftCeiling {
		t.Errorf("drift of a tenfold jump = %v, want the ceiling %v", s, driftCeiling)
	}
}
