package deadline

import (
	"math"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

var b0 = time.Date(2026, 12, 1, 16, 0, 0, 0, time.UTC)

// historyA is a run like the simulation's workload A: full windows of
// 300 s iterations, 120 s checkpoints and 60 s snapshots with some spread,
// M = 60 s, and its last durable save lost seconds before now.
func historyA(now time.Time, lost time.Duration) History {
	h := NewHistory()
	for i := range 40 {
		h.Iterations.Push(300 * (1 + 0.06*math.Sin(float64(i))))
	}
	for i := range 8 {
		h.Checkpoints.Push(120 * (1 + 0.1*math.Cos(float64(i))))
		h.Snapshots.Push(60 * (1 + 0.2*math.Sin(float64(i))))
	}
	h.PriorCheckpointSeconds, h.PriorSnapshotSeconds = 120, 60
	h.MarginSeconds = 60
	h.LastDurableSave = now.Add(-lost)
	return h
}

// firstFire is the slack x = B − M − now (to the second) at which the
// policy first fires, stepping now towards B one second at a time with
// the last durable save fixed lost before B.
func firstFire(t *testing.T, p ExpectedLoss, saveFollows bool, lostAtB time.Duration) float64 {
	t.Helper()
	for s := 3600; s >= -60; s-- {
		now := b0.Add(-time.Duration(s) * time.Second)
		h := historyA(now, lostAtB-time.Duration(s)*time.Second)
		if a := p.Assess(now, b0, saveFollows, &h); a.Fire {
			return a.SlackSeconds
		}
	}
	t.Fatal("never fired, even past B")
	return 0
}

func TestWorstCaseFitsSkipsTheArithmetic(t *testing.T) {
	h := historyA(b0, 0)
	est := ExpectedLoss{}.WorstCase(&h)
	// Max's FiresAt over the worst-case estimates is where the shortcut
	// ends: the earliest the policy can fire.
	bound := Max{}.FiresAt(b0, est)
	for _, tc := range []struct {
		now      time.Time
		shortcut bool
	}{
		{bound.Add(-time.Hour), true},
		{bound, true},
		{bound.Add(time.Second), false},
	} {
		h := historyA(tc.now, 10*time.Minute)
		a := ExpectedLoss{}.Assess(tc.now, b0, false, &h)
		if a.WorstCase != tc.shortcut {
			t.Errorf("%v before B: WorstCase %v, want %v (%s)", b0.Sub(tc.now), a.WorstCase, tc.shortcut, a.Explanation)
		}
		if a.WorstCase && (a.Fire || a.LossNowSeconds != 0 || a.LossNextSeconds != 0) {
			t.Errorf("the shortcut fired or computed losses: %+v", a)
		}
		if !a.WorstCase && (a.LossNowSeconds == 0 || a.LossNextSeconds == 0) {
			t.Errorf("past the shortcut, no losses computed: %+v", a)
		}
	}
	got, want := est.Iteration+est.Checkpoint+est.Reserve, (ExpectedLoss{}).Assess(bound, b0, false, &h).WorstCaseSeconds
	if math.Abs(got-want) > 1e-6 {
		t.Errorf("WorstCase estimates add to %v s, the assessment's worst case is %v s", got, want)
	}
}

// The shortcut is exact: wherever it applies, the full comparison would
// continue too (saving now wastes the step that still fits).
func TestShortcutAgreesWithTheFullComparison(t *testing.T) {
	p := ExpectedLoss{}.Defaults()
	for _, lost := range []float64{0, 600, 3 * 3600} {
		h := historyA(b0, 0)
		m := newModel(&h)
		worst := m.iter.hi() + m.save.hi()
		for _, extra := range []float64{0, 1, 100, 5000} {
			x := worst + extra
			now, _ := p.saveLoss(&m.save, x, lost, h.MarginSeconds)
			next, miss := p.afterStep(&m, x, lost, h.MarginSeconds)
			if next >= now || (extra > 0 && miss != 0) {
				t.Errorf("lost %v s, slack %v s: saving now %v, after a step %v (P(miss) %v): want continuing cheaper and safe", lost, x, now, next, miss)
			}
		}
	}
}

func TestSaveLossByHand(t *testing.T) {
	var d support
	d.add(200, 0.5)
	d.add(100, 0.5)
	d.seal()
	p := ExpectedLoss{MissPenaltySeconds: 600, TauSeconds: 1500, TauPenaltySeconds: 14400}
	// y = 150, M = 0: half the time the save takes 100 s and 50 s are left
	// unused; half the time it misses and loses 1000 + 150 s of work plus
	// the penalty (1150 s ≤ τ: no τ penalty).
	if loss, miss := p.saveLoss(&d, 150, 1000, 0); loss != 0.5*50+0.5*(1150+600) || miss != 0.5 {
		t.Errorf("F(150) = %v, P(miss) %v; want 900 and 0.5", loss, miss)
	}
	// Past τ the miss costs the τ penalty too.
	if loss, _ := p.saveLoss(&d, 150, 1400, 0); loss != 0.5*50+0.5*(1550+600+14400) {
		t.Errorf("F(150) past τ = %v, want %v", loss, 0.5*50+0.5*(1550+600+14400))
	}
	// Everything fits: the unused time, margin included.
	if loss, miss := p.saveLoss(&d, 300, 1000, 60); loss != 0.5*(360-100)+0.5*(360-200) || miss != 0 {
		t.Errorf("F(300), M 60 = %v, P(miss) %v; want 210 and 0", loss, miss)
	}
}

func TestFiresAtTheLatestWhenNoStepCanFit(t *testing.T) {
	h := historyA(b0, 0)
	m := newModel(&h)
	shortest := m.iter.lo() + m.save.lo()
	for _, lost := range []time.Duration{time.Minute, 20 * time.Minute, 4 * time.Hour} {
		if x := firstFire(t, ExpectedLoss{}, false, lost); x < shortest {
			t.Errorf("lost %v: fired at slack %v s, below %v s, where even the shortest step and save could not fit", lost, x, shortest)
		}
	}
	// And once it fires, it fires at every later step.
	fired := false
	for s := 1800; s >= 0; s -= 5 {
		now := b0.Add(-time.Duration(s) * time.Second)
		h := historyA(now, 40*time.Minute)
		a := ExpectedLoss{}.Assess(now, b0, false, &h)
		if fired && !a.Fire {
			t.Fatalf("%d s before B it continues after firing at an earlier step: %s", s, a.Explanation)
		}
		fired = fired || a.Fire
	}
}

func TestMoreAtStakeFiresEarlier(t *testing.T) {
	little := firstFire(t, ExpectedLoss{}, false, 10*time.Minute)
	much := firstFire(t, ExpectedLoss{}, false, 3*time.Hour)
	if much <= little {
		t.Errorf("with 3 h at stake it fires at slack %v s, with 10 min at %v s: want earlier (more slack) with more at stake", much, little)
	}
}

// With little at stake either way, a regular save after the step is one
// more save to fit before B: the policy fires that much earlier. (With much
// at stake it may fire later: the regular save makes a miss after it cheap.)
func TestRegularSaveCountsInTheLookAhead(t *testing.T) {
	without := firstFire(t, ExpectedLoss{}, false, 5*time.Minute)
	with := firstFire(t, ExpectedLoss{}, true, 5*time.Minute)
	h := historyA(b0, 0)
	m := newModel(&h)
	if with < without+m.save.lo() {
		t.Errorf("a regular save after the step: fires at slack %v s, without one at %v s; want at least a save (%v s) earlier", with, without, m.save.lo())
	}
}

func TestExplanationInExpectedLossTerms(t *testing.T) {
	now := b0.Add(-14 * time.Minute)
	h := historyA(now, 40*time.Minute)
	a := ExpectedLoss{}.Assess(now, b0, false, &h)
	re := regexp.MustCompile(`^saving now: expected loss \d+\.\d min \(P\(miss\) [^)]+\); one more step: \d+\.\d min \(P\(miss\) [^)]+\): (save now and stop|continue)$`)
	if !re.MatchString(a.Explanation) {
		t.Errorf("explanation %q does not match %v", a.Explanation, re)
	}
	if a.Fire != (a.LossNowSeconds <= a.LossNextSeconds) {
		t.Errorf("Fire %v, but saving now %v s against one more step %v s", a.Fire, a.LossNowSeconds, a.LossNextSeconds)
	}
	if v := a.Verdict(); v.Fire != a.Fire || v.Explanation != a.Explanation {
		t.Errorf("Verdict %+v differs from the assessment", v)
	}
}

func TestExpectedLossIsPureAndDeterministic(t *testing.T) {
	now := b0.Add(-15 * time.Minute)
	h := historyA(now, 40*time.Minute)
	before := h
	p := ExpectedLoss{SafetySaves: true}
	first := p.Assess(now, b0, false, &h)
	for range 3 {
		if again := p.Assess(now, b0, false, &h); !reflect.DeepEqual(again, first) {
			t.Fatalf("same inputs, different assessments:\n%+v\n%+v", first, again)
		}
	}
	if !reflect.DeepEqual(h, before) {
		t.Error("Assess changed the history")
	}
}

func TestSafetySave(t *testing.T) {
	// Long iterations (15 min, one in eight twice as long) and short saves
	// (3 min): near B, one more step puts hours of work at stake on a slow
	// step; a save first costs 3 minutes and brings the stake under τ.
	long := func(now time.Time) History {
		h := historyA(now, 3*time.Hour)
		h.Iterations = NewRing(IterationHistory)
		for i := range 32 {
			h.Iterations.Push(900 * float64(1+i%8/7))
		}
		return h
	}
	p := ExpectedLoss{SafetySaves: true}
	saw := false
	for s := 3 * 3600; s >= 0; s -= 30 {
		now := b0.Add(-time.Duration(s) * time.Second)
		h := long(now)
		a := p.Assess(now, b0, false, &h)
		if a.Fire && a.SafetySave {
			t.Fatalf("%d s before B: both fire and safety save", s)
		}
		if a.SafetySave {
			saw = true
			if a.LossSafetySeconds >= min(a.LossNowSeconds, a.LossNextSeconds) || !strings.HasSuffix(a.Explanation, ": save now and continue") {
				t.Errorf("%d s before B: %s", s, a.Explanation)
			}
		}
		if f := p.Assess(now, b0, true, &h); f.SafetySave {
			t.Fatalf("%d s before B: a safety save where a regular save follows anyway", s)
		}
		if off := (ExpectedLoss{}).Assess(now, b0, false, &h); off.SafetySave || off.LossSafetySeconds != 0 {
			t.Fatalf("%d s before B: a safety save considered with SafetySaves off", s)
		}
	}
	if !saw {
		t.Error("with 3 h of work at stake on a 15-minute step, no safety save in the last 3 hours")
	}
}

func TestNoIterationMeasured(t *testing.T) {
	h := historyA(b0, 0)
	h.Iterations = NewRing(IterationHistory)
	m := newModel(&h)
	for _, tc := range []struct {
		slack float64
		fire  bool
	}{{m.save.hi() + 1, false}, {m.save.hi() - 1, true}} {
		now := b0.Add(-Seconds(tc.slack + h.MarginSeconds))
		if a := (ExpectedLoss{}).Assess(now, b0, false, &h); a.Fire != tc.fire {
			t.Errorf("no iteration, slack %v s, longest save %v s: Fire %v, want %v (%s)", tc.slack, m.save.hi(), a.Fire, tc.fire, a.Explanation)
		}
	}
}

func TestDefaults(t *testing.T) {
	d := ExpectedLoss{}.Defaults()
	if d.MissPenaltySeconds != DefaultMissPenalty.Seconds() || d.TauSeconds != DefaultTau.Seconds() || d.TauPenaltySeconds != DefaultTauPenalty.Seconds() || d.SafetySaves {
		t.Errorf("defaults %+v", d)
	}
	set := ExpectedLoss{MissPenaltySeconds: 1, TauSeconds: 2, TauPenaltySeconds: 3, SafetySaves: true}
	if set.Defaults() != set {
		t.Errorf("Defaults changed set knobs: %+v", set.Defaults())
	}
}

// BenchmarkDecision is one decision with full windows: where the worst
// case fits (most steps), near B, near B with a regular save following,
// and near B with safety saves (the most arithmetic).
func BenchmarkDecision(b *testing.B) {
	for _, bc := range []struct {
		name        string
		before      time.Duration
		saveFollows bool
		p           ExpectedLoss
	}{
		{"worst-case-fits", time.Hour, false, ExpectedLoss{}},
		{"near-B", 14 * time.Minute, false, ExpectedLoss{}},
		{"near-B-regular-save", 20 * time.Minute, true, ExpectedLoss{}},
		{"near-B-safety-saves", 20 * time.Minute, false, ExpectedLoss{SafetySaves: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			now := b0.Add(-bc.before)
			h := historyA(now, 40*time.Minute)
			b.ReportAllocs()
			for b.Loop() {
				bc.p.Assess(now, b0, bc.saveFollows, &h)
			}
		})
	}
}
