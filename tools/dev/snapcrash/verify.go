package main

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

// verdict is one verification of the acknowledged writes.
type verdict struct {
	checked int
	// lost holds each write found missing (or changed), and what was found.
	lost map[string]bool
	// unread holds each read that failed: the writes it would have
	// checked are unverified, not known to be lost.
	unread map[string]bool
}

func (v *verdict) lose(format string, args ...any) { note(&v.lost, format, args...) }

func (v *verdict) cannotRead(format string, args ...any) { note(&v.unread, format, args...) }

func note(set *map[string]bool, format string, args ...any) {
	if *set == nil {
		*set = map[string]bool{}
	}
	(*set)[fmt.Sprintf(format, args...)] = true
}

func (v *verdict) add(o verdict) {
	v.checked += o.checked
	for msg := range o.lost {
		note(&v.lost, "%s", msg)
	}
	for msg := range o.unread {
		note(&v.unread, "%s", msg)
	}
}

// verify checks every write acknowledged so far against the coordinator:
// the run exists; every registered worker is known with at least the
// acknowledged incarnation; every checkpoint all ranks were told was saved
// is published; every acknowledged snapshot report is recorded with its
// outcome; and every decision, asked again, is identical to the one given.
func verify(ctx context.Context, admin *client.Client, r *runWriters) verdict {
	// checked counts a write once the read that checks it succeeded: a
	// write whose read failed is unverified, not verified.
	var v verdict
	a := r.log.copyRun(r.id)
	if _, err := admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: r.id}); err != nil {
		v.cannotRead("run %s: GetRun: %v (every write of the run is unverified)", r.id, err)
		return v
	}
	v.checked++

	workers, err := admin.RunWorkers(ctx, r.id)
	if err != nil {
		v.cannotRead("run %s: ListWorkers: %v", r.id, err)
	} else {
		v.checked += len(a.workers)
		known := map[string]int64{}
		for _, w := range workers {
			known[w.WorkerId] = w.Incarnation
		}
		for id, inc := range a.workers {
			if got, ok := known[id]; !ok || got < inc {
				v.lose("run %s: worker %s registered (incarnation %d) but the coordinator has incarnation %d (known: %v)", r.id, id, inc, got, ok)
			}
		}
	}

	published := map[int64]bool{}
	err = admin.WatchEvents(ctx, r.id, 0, false, func(ev *v1.RunEvent) error {
		if ev.Type == v1.RunEventType_RUN_EVENT_TYPE_CHECKPOINT_PUBLISHED {
			published[ev.Step] = true
		}
		return nil
	})
	if err != nil {
		v.cannotRead("run %s: WatchRun: %v", r.id, err)
	}
	for step, ranks := range a.saved {
		if len(ranks) < a.worldSize || err != nil {
			continue // half-acknowledged: checked once every rank is
		}
		v.checked += len(ranks)
		if !published[step] {
			v.lose("run %s: all %d ranks were told their checkpoint of step %d was saved, but it was never published", r.id, a.worldSize, step)
		}
	}

	snaps, err := admin.Snapshots(ctx, r.id)
	if err != nil {
		v.cannotRead("run %s: %v", r.id, err)
	} else {
		got := map[string]map[string]v1.SnapshotOutcome{}
		for _, s := range snaps {
			got[s.SnapshotId] = map[string]v1.SnapshotOutcome{}
			for _, rep := range s.Reports {
				got[s.SnapshotId][rep.WorkerId] = rep.Outcome
			}
		}
		for sid, reps := range a.snapReports {
			v.checked += len(reps)
			for wid, o := range reps {
				if g, ok := got[sid][wid]; !ok || g != o {
					v.lose("run %s: %s's report %v on %s was acknowledged but the coordinator has %v (recorded: %v)", r.id, wid, o, sid, g, ok)
				}
			}
		}
	}

	v.add(verifyDecisions(ctx, r, a.decisions))
	return v
}

// verifyDecisions asks rank 0 about every decided step again: the answer
// must be the decision first given, to the timestamp.
func verifyDecisions(ctx context.Context, r *runWriters, decisions map[int64]*v1.Decision) verdict {
	steps := make([]int64, 0, len(decisions))
	for s := range decisions {
		steps = append(steps, s)
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i] < steps[j] })
	var mu sync.Mutex
	var v verdict
	next := make(chan int64)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for step := range next {
				var d *v1.Decision
				err := until(ctx, func(ctx context.Context) (err error) {
					d, err = r.trainers[0].CompleteStep(ctx, step, 0)
					return err
				})
				mu.Lock()
				switch {
				case err != nil:
					v.cannotRead("run %s: CompleteStep(%d) asked again: %v", r.id, step, err)
				case !proto.Equal(d, decisions[step]):
					v.checked++
					v.lose("run %s: step %d decided %v before the crash, %v after", r.id, step, decisions[step], d)
				default:
					v.checked++
				}
				mu.Unlock()
			}
		})
	}
	for _, s := range steps {
		next <- s
	}
	close(next)
	wg.Wait()
	return v
}
