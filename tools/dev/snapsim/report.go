package main

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// summary is one policy's figures on one workload; wastes in minutes.
type summary struct {
	Policy            string
	MissPct           float64
	Mean, P99, Max    float64
	HMean, HP99, HMax float64 // counted honestly
}

// runAll simulates runs runs of w on procs goroutines. Run i draws from its
// own generator, seeded by (seed, workload, i), and lands in row i, so the
// result does not depend on procs or on scheduling.
func runAll(w *Workload, wIndex int, runs int, seed uint64, procs int, policies []policy) [][]outcome {
	rows := make([][]outcome, runs)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range max(procs, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= runs {
					return
				}
				rng := rand.New(rand.NewPCG(seed, uint64(wIndex)<<32|uint64(i)))
				steps := w.trajectory(rng)
				row := []outcome{oracle(w, steps)}
				for _, p := range policies {
					row = append(row, simulate(w, steps, p))
				}
				rows[i] = row
			}
		}()
	}
	wg.Wait()
	return rows
}

// summarise turns rows (oracle first, then policies) into one summary per
// column.
func summarise(rows [][]outcome, policies []policy) []summary {
	names := []string{"oracle"}
	for _, p := range policies {
		names = append(names, p.name())
	}
	out := make([]summary, len(names))
	wastes, honest := make([]float64, len(rows)), make([]float64, len(rows))
	for c, name := range names {
		misses := 0
		for i, row := range rows {
			wastes[i] = row[c].Waste / 60
			honest[i] = (row[c].Waste + row[c].Safety) / 60
			if row[c].Miss {
				misses++
			}
		}
		s := summary{Policy: name, MissPct: 100 * float64(misses) / float64(len(rows))}
		s.Mean, s.P99, s.Max = stats(wastes)
		s.HMean, s.HP99, s.HMax = stats(honest)
		out[c] = s
	}
	return out
}

// stats sorts vs and returns its mean, 99th percentile and maximum.
func stats(vs []float64) (mean, p99, most float64) {
	slices.Sort(vs)
	for _, v := range vs {
		mean += v
	}
	return mean / float64(len(vs)), quantile(vs, 0.99), vs[len(vs)-1]
}

// quantile of sorted vs: the smallest value with at least q of them at or
// below it.
func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// writeTable prints one workload's summaries as a markdown table.
func writeTable(out io.Writer, w *Workload, sums []summary) {
	fmt.Fprintf(out, "**%s**: %s.\n\n", w.Name, w.About)
	fmt.Fprintln(out, "| policy | miss % | mean | p99 | max | honest mean | honest p99 | honest max |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, s := range sums {
		fmt.Fprintf(out, "| %s | %.2f | %.1f | %.1f | %.0f | %.1f | %.1f | %.0f |\n",
			s.Policy, s.MissPct, s.Mean, s.P99, s.Max, s.HMean, s.HP99, s.HMax)
	}
	fmt.Fprintln(out)
}

func defaultProcs() int { return min(runtime.NumCPU(), 2) }
