package main

import (
	"context"
	"slices"
	"sync"
	"time"
)

// window is a measurement: warm up, then count for dur.
type window struct {
	warmup, dur time.Duration
}

// loopResult is what a closed loop measured inside its window.
type loopResult struct {
	ops  int
	dur  time.Duration
	lats []time.Duration // of the operations that started and ended inside the window
}

func (r loopResult) rate() float64 { return float64(r.ops) / r.dur.Seconds() }

// hooks run at the window's edges, e.g. to read the server's CPU time.
type hooks struct {
	begin, end func()
}

// closedLoop runs n goroutines, each calling op back to back (op's k
// counts that goroutine's calls from 0), until the window ends. The first
// error stops every goroutine and is returned.
func closedLoop(ctx context.Context, n int, w window, h *hooks, op func(ctx context.Context, i int, k int64) error) (loopResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	start := time.Now()
	from, to := start.Add(w.warmup), start.Add(w.warmup+w.dur)
	var edges sync.WaitGroup
	if h != nil {
		edges.Go(func() {
			if !sleepCtx(ctx, time.Until(from)) {
				return
			}
			if h.begin != nil {
				h.begin()
			}
			if !sleepCtx(ctx, time.Until(to)) {
				return
			}
			if h.end != nil {
				h.end()
			}
		})
	}
	lats := make([][]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			mine := make([]time.Duration, 0, 1024)
			for k := int64(0); ctx.Err() == nil; k++ {
				t := time.Now()
				if !t.Before(to) {
					break
				}
				if err := op(ctx, i, k); err != nil {
					cancel(err)
					break
				}
				e := time.Now()
				if !t.Before(from) && !e.After(to) {
					mine = append(mine, e.Sub(t))
				}
			}
			lats[i] = mine
		})
	}
	wg.Wait()
	edges.Wait()
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return loopResult{}, err
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	return loopResult{ops: len(all), dur: w.dur, lats: all}, nil
}

// sleepCtx waits d or until ctx ends; false if ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// latency summarises sorted durations.
type latency struct {
	P50, P99, Max time.Duration
}

func summarize(sorted []time.Duration) latency {
	if len(sorted) == 0 {
		return latency{}
	}
	q := func(p float64) time.Duration {
		i := int(p*float64(len(sorted))+0.5) - 1
		return sorted[min(max(i, 0), len(sorted)-1)]
	}
	return latency{P50: q(0.50), P99: q(0.99), Max: sorted[len(sorted)-1]}
}
