package engine

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/snapcoord/snapcoord/store"
)

// Finished runs are deleted once Options.FinishedRunRetention has passed
// since they ended, so that a coordinator shared by many jobs for months
// neither reaches max_runs nor holds every finished run's events in
// memory. A sweep looks for them once a minute (or once a retention, if
// shorter), so a run is deleted up to that much after its time.

// purgeFinished deletes the finished runs past their retention and
// schedules the next sweep.
func (e *Engine) purgeFinished() {
	if e.usable() != nil {
		return // closing, or the store cannot commit: nothing to sweep into
	}
	for _, r := range e.pastRetention() {
		e.purge(r)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closed.Load() {
		e.sweep = e.clk.AfterFunc(min(e.opts.FinishedRunRetention, time.Minute), e.purgeFinished)
	}
}

func (e *Engine) pastRetention() []*runState {
	cutoff := e.clk.Now().Add(-e.opts.FinishedRunRetention)
	e.mu.RLock()
	runs := e.allRuns()
	e.mu.RUnlock()
	var due []*runState
	for _, r := range runs {
		r.mu.Lock()
		if ended := r.rec.Run.EndedAt; r.terminal() && ended != nil && !ended.AsTime().After(cutoff) {
			due = append(due, r)
		}
		r.mu.Unlock()
	}
	return due
}

// purge deletes a run from memory and the store. The delete is submitted
// before the run leaves the maps, so a run created again under the same id
// commits after it.
func (e *Engine) purge(r *runState) {
	e.mu.Lock()
	if e.runs[r.id] != r {
		e.mu.Unlock()
		return
	}
	r.mu.Lock()
	r.purged = true
	r.stopTimers()
	var b store.Batch
	b.DeleteRun(r.id)
	p := e.st.Submit(&b)
	r.last = p
	state, ended := stateName(r.state()), r.rec.Run.EndedAt.AsTime()
	e.setToken(r.rec.GetTokenHash(), nil, r.id)
	r.mu.Unlock()
	delete(e.runs, r.id)
	if i := sort.SearchStrings(e.ids, r.id); i < len(e.ids) && e.ids[i] == r.id {
		e.ids = slices.Delete(e.ids, i, i+1)
	}
	e.mu.Unlock()
	if err := e.wait(context.Background(), p); err == nil {
		e.log.Info("finished run deleted after its retention", "run_id", r.id, "state", state,
			"ended_at", ended, "retention", e.opts.FinishedRunRetention)
	}
}

// gone is NOT_FOUND for a run deleted after its retention.
func (r *runState) gone() error {
	if r.purged {
		return errorf(ErrNotFound, "run %q not found", r.id)
	}
	return nil
}
