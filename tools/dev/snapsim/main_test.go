package main

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tiny is a workload small enough to check run by run: a 1 h walltime,
// 2-minute steps, a regular save every 5 steps.
var tiny = Workload{Name: "T", About: "tiny", Walltime: 3600, Iteration: 120, Checkpoint: 90,
	Snapshot: 45, SaveEvery: 5, PriorCheckpoint: 90, PriorSnapshot: 45}

// The oracle fires at the best step of the run that never stops early; no
// policy can do better, counted honestly (a safety save only shifts the
// same steps later).
func TestOracleWastesLeastOnEveryRun(t *testing.T) {
	ps := policies()
	for i := range 300 {
		rng := rand.New(rand.NewPCG(1, uint64(i)))
		steps := tiny.trajectory(rng)
		best := oracle(&tiny, steps)
		for _, p := range ps {
			o := simulate(&tiny, steps, p)
			if best.Waste > o.Waste+o.Safety+1e-9 {
				t.Fatalf("run %d: the oracle wastes %.1f s, %s %.1f s (safety saves %.1f s)", i, best.Waste, p.name(), o.Waste, o.Safety)
			}
			if o.Waste < 0 || o.Waste > tiny.Walltime {
				t.Fatalf("run %d: %s wastes %.1f s of a %v s walltime", i, p.name(), o.Waste, tiny.Walltime)
			}
		}
	}
}

func TestSimulateCountsAMissFromTheLastDurableSave(t *testing.T) {
	w := Workload{Walltime: 1000, SaveEvery: 2}
	steps := []Step{
		{Iteration: 100, Done: 100, Checkpoint: 10, Snapshot: 10},
		{Iteration: 100, Done: 200, Checkpoint: 30, Snapshot: 20, RegularSave: true}, // durable at 250
		{Iteration: 600, Done: 850, Checkpoint: 100, Snapshot: 100},                  // a save would end at 1050
	}
	never := fixed{at: -1, safetyAt: -1}
	if o := simulate(&w, steps, never); !o.Miss || o.Waste != 750 {
		t.Errorf("never firing: %+v, want a miss wasting 1000 - 250 = 750 s", o)
	}
	if o := simulate(&w, steps, fixed{at: 2, safetyAt: -1}); !o.Miss || o.Waste != 750 {
		t.Errorf("firing at step 3, whose save ends after B: %+v, want a miss wasting 750 s", o)
	}
	if o := simulate(&w, steps, fixed{at: 1, safetyAt: -1}); o.Miss || o.Waste != 750 {
		t.Errorf("firing at step 2 (its save, the regular one, ends at 250): %+v, want 750 s left unused", o)
	}
	if o := oracle(&w, steps); o.Miss || o.Waste != 750 {
		t.Errorf("oracle: %+v, want step 2 and 750 s", o)
	}
	// A safety save at step 1 delays the rest: step 2 then completes at 220.
	if o := simulate(&w, steps, fixed{at: 1, safetyAt: 0}); o.Miss || o.Safety != 20 || o.Waste != 1000-(220+50) {
		t.Errorf("safety save at step 1, firing at step 2: %+v, want 20 s of safety saves and 730 s left", o)
	}
}

// fixed fires at step index at and takes a safety save at step index
// safetyAt (-1: never).
type fixed struct{ at, safetyAt int }

func (fixed) name() string { return "fixed" }

func (f fixed) decide(k *knowledge, _ float64, _ Step) verdict {
	i := k.hist.Iterations.Len() - 1
	switch {
	case i == f.at:
		return fire
	case i == f.safetyAt:
		return safetySave
	}
	return proceed
}

func TestSameSeedSameTables(t *testing.T) {
	table := func(args ...string) string {
		var out, errs bytes.Buffer
		if code := run(append([]string{"--runs", "40", "--workloads", "AG"}, args...), &out, &errs); code != 0 {
			t.Fatalf("snapsim %v: exit %d: %s", args, code, errs.String())
		}
		return out.String()
	}
	first := table("--seed", "7", "--procs", "1")
	if again := table("--seed", "7", "--procs", "2"); again != first {
		t.Errorf("same seed, 1 and 2 goroutines, different tables:\n%s\n%s", first, again)
	}
	if other := table("--seed", "8"); other == first {
		t.Error("another seed printed the same tables")
	}
	for _, want := range []string{"**A**", "**G**", "| oracle |", "| Max (main) |", "| ExpectedLoss |", "| ExpectedLoss + safety saves |"} {
		if !strings.Contains(first, want) {
			t.Errorf("the tables lack %q:\n%s", want, first)
		}
	}
}

func TestDocSection(t *testing.T) {
	doc := filepath.Join(t.TempDir(), "sim.md")
	if err := os.WriteFile(doc, []byte("# Sim\n\n<!-- snapsim:begin -->\nold\n<!-- snapsim:end -->\n\ntail\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	if code := run([]string{"--runs", "5", "--workloads", "G", "--doc", doc}, &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	got, _ := os.ReadFile(doc)
	if !strings.Contains(string(got), out.String()) || strings.Contains(string(got), "old") || !strings.HasSuffix(string(got), "<!-- snapsim:end -->\n\ntail\n") {
		t.Errorf("doc after --doc:\n%s", got)
	}
	if code := run([]string{"--runs", "5", "--workloads", "G", "--doc", doc, "--frontier"}, &out, &errs); code != 1 || !strings.Contains(errs.String(), "snapsim-frontier:begin") {
		t.Errorf("--frontier into a doc without its section: exit %d, %s", code, errs.String())
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--workloads", "AZ"}, {"--runs", "0"}, {"--nope"}} {
		var out, errs bytes.Buffer
		if code := run(args, &out, &errs); code != 2 {
			t.Errorf("snapsim %v: exit %d, want 2 (%s)", args, code, errs.String())
		}
	}
}
