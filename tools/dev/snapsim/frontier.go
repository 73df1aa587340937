package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/snapcoord/snapcoord/server/deadline"
)

// The bar of issue 15, counted honestly, minutes.
const (
	barMean = 8
	barP99  = 25
)

// candidate is one setting of ExpectedLoss's knobs and its worst figures
// over the workloads, counted honestly.
type candidate struct {
	p                   lossPolicy
	mean, p99, miss     float64 // worst over workloads
	meetsBar, beatsMax  int     // workloads where it meets the bar; where its p99 ≤ Max's
	meanAt, p99At       string  // the workloads of the worst mean and p99
	dominated, isChosen bool
}

// grid is the settings the frontier compares: the miss penalty, the τ
// penalty, the margin, and safety saves off or on (τ is the operator's).
func grid() []lossPolicy {
	var out []lossPolicy
	for _, safety := range []bool{false, true} {
		for _, margin := range []float64{0, 30, marginSeconds} {
			for _, pen := range []time.Duration{5 * time.Minute, 10 * time.Minute, 20 * time.Minute} {
				for _, tauPen := range []time.Duration{30 * time.Minute, time.Hour, 4 * time.Hour} {
					p := deadline.ExpectedLoss{MissPenaltySeconds: pen.Seconds(), TauPenaltySeconds: tauPen.Seconds(), SafetySaves: safety}
					out = append(out, lossPolicy{label: knobs(p, margin), margin: margin, p: p})
				}
			}
		}
	}
	return out
}

func knobs(p deadline.ExpectedLoss, margin float64) string {
	s := fmt.Sprintf("penalty %.0f min, τ penalty %.0f min, M %.0f s", p.MissPenaltySeconds/60, p.TauPenaltySeconds/60, margin)
	if p.SafetySaves {
		s += ", safety saves"
	}
	return s
}

// frontier simulates every setting of the grid on every workload and prints
// those no other setting beats on worst mean, worst p99 and worst miss % at
// once (and the default), best worst-case p99 first.
func frontier(out io.Writer, cfg config, chosen lossPolicy) {
	all := workloads()
	cands := grid()
	ps := []policy{maxPolicy{margin: marginSeconds}}
	for _, c := range cands {
		ps = append(ps, c)
	}
	res := make([]candidate, len(cands))
	for i, c := range cands {
		res[i] = candidate{p: c, isChosen: c.label == chosen.label}
	}
	for wi := range all {
		w := &all[wi]
		sums := summarise(runAll(w, wi, cfg.runs, cfg.seed, cfg.procs, ps), ps)
		maxP99 := sums[1].HP99
		for i, s := range sums[2:] {
			r := &res[i]
			if s.HMean > r.mean {
				r.mean, r.meanAt = s.HMean, w.Name
			}
			if s.HP99 > r.p99 {
				r.p99, r.p99At = s.HP99, w.Name
			}
			r.miss = max(r.miss, s.MissPct)
			if s.HMean <= barMean && s.HP99 <= barP99 {
				r.meetsBar++
			}
			if s.HP99 <= maxP99 {
				r.beatsMax++
			}
		}
	}
	for i := range res {
		for j := range res {
			a, b := res[i], res[j]
			if i != j && b.mean <= a.mean && b.p99 <= a.p99 && b.miss <= a.miss &&
				(b.mean < a.mean || b.p99 < a.p99 || b.miss < a.miss) {
				res[i].dominated = true
				break
			}
		}
	}
	slices.SortStableFunc(res, func(a, b candidate) int {
		if a.p99 != b.p99 {
			return cmp.Compare(a.p99, b.p99)
		}
		return cmp.Compare(a.mean, b.mean)
	})
	fmt.Fprintf(out, "%d runs per workload, seed %d; the worst of workloads A-H for each setting, counted honestly (minutes).\n\n", cfg.runs, cfg.seed)
	fmt.Fprintln(out, "| ExpectedLoss setting | worst mean | worst p99 | worst miss % | bar met | p99 ≤ Max's | frontier |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|---|")
	hidden := 0
	for _, r := range res {
		if r.dominated && !r.isChosen {
			hidden++
			continue
		}
		mark := ""
		if !r.dominated {
			mark = "yes"
		}
		name := r.p.label
		if r.isChosen {
			name = "**" + name + " (default)**"
		}
		fmt.Fprintf(out, "| %s | %.1f (%s) | %.1f (%s) | %.2f | %d of %d | %d of %d | %s |\n",
			name, r.mean, r.meanAt, r.p99, r.p99At, r.miss, r.meetsBar, len(all), r.beatsMax, len(all), mark)
	}
	fmt.Fprintf(out, "\n%d of the %d settings, beaten on all three by one of these, are not shown.\n\n", hidden, len(res))
}
