package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"sort"

	"google.golang.org/protobuf/types/known/timestamppb"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

const defaultPageSize = 100

func (e *Engine) CreateRun(ctx context.Context, req *v1.CreateRunRequest) (*v1.CreateRunResponse, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err // as mutateRun: a call that ended (its term did) changes nothing
	}
	// A repeat is judged against the run as created (createAgain): the
	// checks below are relative to now and to today's limits, which a run
	// created earlier need not meet again.
	if r, _ := e.run(req.RunId); r != nil {
		return e.createAgain(ctx, r, req.GetSpec())
	}
	now := e.clk.Now()
	spec, err := normalizeSpec(req.GetSpec(), now)
	if err != nil {
		return nil, err
	}
	if max := e.opts.MaxWorkersPerRun; int(spec.TrainerWorldSize) > max {
		// Its ranks could never all register, so no checkpoint could ever
		// be saved by all of them.
		return nil, errorf(ErrInvalidArgument, "spec.trainer_world_size: %d ranks are more than this coordinator's max_workers_per_run %d",
			spec.TrainerWorldSize, max)
	}
	e.mu.Lock()
	if r := e.runs[req.RunId]; r != nil {
		e.mu.Unlock()
		return e.createAgain(ctx, r, req.GetSpec())
	}
	if len(e.runs) >= e.opts.MaxRuns {
		e.mu.Unlock()
		return nil, errorf(ErrResourceExhausted, "limit max_runs (%d) reached; finished runs are deleted after --finished-run-retention", e.opts.MaxRuns)
	}
	token, hash := newToken()
	r := newRunState(&storagev1.RunRecord{
		Run: &v1.Run{
			RunId: req.RunId, State: v1.RunState_RUN_STATE_PENDING, Spec: spec,
			CreatedAt: timestamppb.New(now), Deadline: &v1.Deadline{},
		},
		RequestedSpec: req.GetSpec(),
		TokenHash:     hash,
	})
	e.runs[r.id] = r
	e.setToken(nil, hash, r.id)
	i := sort.SearchStrings(e.ids, r.id)
	e.ids = append(e.ids[:i], append([]string{r.id}, e.ids[i:]...)...)
	// The run is locked before the map's lock is released, so no other call
	// sees it before its first record is submitted.
	r.mu.Lock()
	e.mu.Unlock()
	m := &mut{e: e, r: r, now: now}
	m.start()
	own := m.flush()
	view, last := r.view(), r.last
	r.mu.Unlock()
	if err := e.settle(ctx, m, last, own); err != nil {
		return nil, err
	}
	return &v1.CreateRunResponse{Run: view, RunToken: token}, nil
}

// start records a new run and arms its timers.
func (m *mut) start() {
	b, err := mustSaveBy(m.r.rec.Run.Spec.StartedAt.AsTime(), m.r.rec.Run.Spec.Checkpointing.CheckpointMustSaveBy,
		m.r.rec.Run.Spec.Checkpointing.MustSaveBy, "spec.checkpointing.")
	if err == nil && !b.IsZero() {
		m.r.rec.Run.Deadline.MustSaveBy = timestamppb.New(b)
	}
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_RUN_CREATED, State: m.r.state(),
		Message: fmt.Sprintf("run created: %d trainer ranks, %s", m.r.rec.Run.Spec.TrainerWorldSize, describeDeadline(m.r))})
	m.steps().armPreStep()
	m.snapshots().armInterval(true)
	m.missed().armMissed()
}

// createAgain answers a CreateRun of a run that exists: the same spec is a
// repeat, a different one ALREADY_EXISTS. The token cannot be returned
// again (only its hash is kept); until a worker has registered, a repeat
// gets a new one instead, and the earlier one stops working. A caller
// whose first answer was lost (a timeout, a coordinator killed right after
// the commit) would otherwise hold a run no worker can ever join.
func (e *Engine) createAgain(ctx context.Context, r *runState, spec *v1.RunSpec) (*v1.CreateRunResponse, error) {
	resp := &v1.CreateRunResponse{}
	err := e.mutateRun(ctx, r, func(m *mut) error {
		same, err := sameSpec(r.rec.Run.Spec, spec)
		if err != nil {
			return err
		}
		if !same {
			return errorf(ErrAlreadyExists, "run %q already exists with a different spec", r.id)
		}
		if r.rec.LastWorkerNum == 0 && !r.terminal() {
			resp.RunToken, resp.TokenReissued = m.reissueToken(
				"CreateRun repeated with the same spec before any worker registered (its first answer may have been lost)"), true
		}
		resp.Run = r.view()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// ReissueRunToken gives a run that goes on in a new allocation (a requeued
// Slurm job) a new token. Only a run whose deadline has not fired: a
// deadline sequence, or a trigger still pending, was the earlier
// allocation's, and would stop the new one at its first step.
func (e *Engine) ReissueRunToken(ctx context.Context, req *v1.ReissueRunTokenRequest) (*v1.ReissueRunTokenResponse, error) {
	resp := &v1.ReissueRunTokenResponse{}
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		r := m.r
		if r.terminal() || r.fired() || r.rec.ManualFirePending {
			return errorf(ErrFailedPrecondition, "run %q is %s%s: its token is not reissued; create a new run for the new allocation",
				r.id, stateName(r.state()), firedNote(r))
		}
		why := oneLine(req.Reason)
		if why == "" {
			why = "reissued by an operator"
		}
		resp.RunToken = m.reissueToken(why)
		resp.Run = r.view()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func firedNote(r *runState) string {
	switch {
	case r.fired():
		return " and its deadline fired"
	case r.rec.ManualFirePending:
		return " with a deadline trigger pending"
	}
	return ""
}

// reissueToken replaces the run's token with a new one and returns it. Under
// the run's lock: concurrent calls leave one token.
func (m *mut) reissueToken(why string) string {
	r := m.r
	token, hash := newToken()
	m.e.setToken(r.rec.TokenHash, hash, r.id)
	r.rec.TokenHash = hash
	m.dirty()
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WARNING,
		Message: "run token reissued: " + why + "; the earlier token no longer works"})
	return token
}

func newToken() (token string, hash []byte) {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	token = "scr_" + base64.RawURLEncoding.EncodeToString(b)
	return token, hashToken(token)
}

func hashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

func (e *Engine) viewRun(ctx context.Context, runID string) (*v1.Run, error) {
	var view *v1.Run
	err := e.view(ctx, runID, func(r *runState) error { view = r.view(); return nil })
	return view, err
}

func (e *Engine) ListRuns(ctx context.Context, req *v1.ListRunsRequest) (*v1.ListRunsResponse, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	after, err := decodePageToken(req.PageToken, "ListRuns", validRunID)
	if err != nil {
		return nil, err
	}
	size := int(req.PageSize)
	if size == 0 {
		size = defaultPageSize
	}
	e.mu.RLock()
	i := sort.SearchStrings(e.ids, after)
	if i < len(e.ids) && e.ids[i] == after {
		i++
	}
	rest := make([]*runState, 0, len(e.ids)-i)
	for _, id := range e.ids[i:] {
		rest = append(rest, e.runs[id])
	}
	e.mu.RUnlock()
	resp := &v1.ListRunsResponse{}
	for _, r := range rest {
		if len(resp.Runs) == size {
			resp.NextPageToken = encodePageToken(resp.Runs[size-1].RunId)
			break
		}
		var view *v1.Run
		if err := e.view(ctx, r.id, func(r *runState) error {
			if req.State == v1.RunState_RUN_STATE_UNSPECIFIED || r.state() == req.State {
				view = r.view()
			}
			return nil
		}); err != nil {
			return nil, err
		}
		if view != nil {
			resp.Runs = append(resp.Runs, view)
		}
	}
	return resp, nil
}

func validRunID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '.' || c == '_' || c == '-')
		if !ok {
			return false
		}
	}
	return true
}

func (e *Engine) GetRun(ctx context.Context, req *v1.GetRunRequest) (*v1.GetRunResponse, error) {
	run, err := e.viewRun(ctx, req.GetRunId())
	if err != nil {
		return nil, err
	}
	return &v1.GetRunResponse{Run: run}, nil
}

func (e *Engine) UpdateDeadline(ctx context.Context, req *v1.UpdateDeadlineRequest) (*v1.UpdateDeadlineResponse, error) {
	if req.CheckpointMustSaveBy == "" && req.MustSaveBy == nil {
		return nil, errorf(ErrInvalidArgument, "checkpoint_must_save_by: give checkpoint_must_save_by or must_save_by")
	}
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		r := m.r
		b, err := mustSaveBy(r.rec.Run.Spec.StartedAt.AsTime(), req.CheckpointMustSaveBy, req.MustSaveBy, "")
		if err != nil {
			return err
		}
		if cur, ok := r.mustSaveBy(); ok && cur.Equal(b) {
			// Already B: a repeat (its first answer lost) answers as the
			// first did, even once the deadline fired.
			return nil
		}
		if r.terminal() || r.fired() {
			return errorf(ErrFailedPrecondition, "run %q: the deadline can no longer be moved (run is %s)", r.id, stateName(r.state()))
		}
		old := describeDeadline(r)
		r.rec.Run.Deadline.MustSaveBy = timestamppb.New(b)
		m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_DEADLINE_UPDATED,
			Message: fmt.Sprintf("deadline moved: %s -> %s", old, describeDeadline(r))})
		m.steps().armPreStep()
		m.missed().armMissed()
		return nil
	})
	if err != nil {
		return nil, err
	}
	run, err := e.viewRun(ctx, req.RunId)
	if err != nil {
		return nil, err
	}
	return &v1.UpdateDeadlineResponse{Run: run}, nil
}

func (e *Engine) TriggerDeadline(ctx context.Context, req *v1.TriggerDeadlineRequest) (*v1.TriggerDeadlineResponse, error) {
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		r := m.r
		reason := oneLine(req.Reason)
		if reason == "" {
			reason = "triggered by an operator"
		}
		if triggeredBy(r, reason) {
			return nil // a repeat, its first answer lost: answered as the first was
		}
		if r.terminal() || r.fired() {
			return errorf(ErrFailedPrecondition, "run %q: the deadline already fired or the run is over (run is %s)", r.id, stateName(r.state()))
		}
		if r.rec.Run.LastStep == 0 {
			r.rec.ManualFireReason = reason
			m.fire(v1.DeadlineFireKind_DEADLINE_FIRE_KIND_MANUAL, 0, reason)
			m.startDeadlineSave(0)
		} else if !r.rec.ManualFirePending {
			r.rec.ManualFirePending = true
			r.rec.ManualFireReason = reason
			m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WARNING,
				Message: "deadline triggered by hand (" + reason + "): the next completed step saves and stops"})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	run, err := e.viewRun(ctx, req.RunId)
	if err != nil {
		return nil, err
	}
	return &v1.TriggerDeadlineResponse{Run: run}, nil
}

// triggeredBy reports whether the run's deadline was triggered by hand with
// reason, pending or fired: the natural key of a TriggerDeadline, so that a
// repeat whose first attempt took effect (its answer lost, or its outcome
// unknown) answers OK rather than "already fired". The reason is kept once
// the trigger fired (terminate clears only a pending one).
func triggeredBy(r *runState, reason string) bool {
	if r.rec.ManualFireReason != reason {
		return false
	}
	return r.rec.ManualFirePending || r.fired() && r.rec.Run.FireKind == v1.DeadlineFireKind_DEADLINE_FIRE_KIND_MANUAL
}

func (e *Engine) CancelRun(ctx context.Context, req *v1.CancelRunRequest) (*v1.CancelRunResponse, error) {
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		r := m.r
		if r.state() == v1.RunState_RUN_STATE_CANCELLED {
			return nil
		}
		if r.terminal() {
			return errorf(ErrFailedPrecondition, "run %q is already %s", r.id, stateName(r.state()))
		}
		reason := oneLine(req.Reason)
		if reason == "" {
			reason = "cancelled by an operator"
		}
		r.rec.Run.FailureMessage = reason
		m.terminate(v1.RunState_RUN_STATE_CANCELLED, reason)
		return nil
	})
	if err != nil {
		return nil, err
	}
	run, err := e.viewRun(ctx, req.RunId)
	if err != nil {
		return nil, err
	}
	return &v1.CancelRunResponse{Run: run}, nil
}

func (e *Engine) FinishRun(ctx context.Context, req *v1.FinishRunRequest) (*v1.FinishRunResponse, error) {
	var state v1.RunState
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		r := m.r
		if _, err := m.r.worker(req.WorkerId, req.Incarnation, v1.WorkerRole_WORKER_ROLE_TRAINER, "FinishRun"); err != nil {
			return err
		}
		state = r.state()
		switch {
		case state == v1.RunState_RUN_STATE_COMPLETED:
			return nil
		case r.terminal():
			return errorf(ErrFailedPrecondition, "run %q is already %s", r.id, stateName(state))
		case r.fired():
			return errorf(ErrFailedPrecondition, "run %q: the deadline sequence is in progress (%s); the run stops when it ends", r.id, stateName(state))
		}
		m.terminate(v1.RunState_RUN_STATE_COMPLETED, "training finished")
		state = r.state()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &v1.FinishRunResponse{RunState: state}, nil
}

// resume re-arms a loaded run's timers and gives its workers a grace period:
// their leases, and the reports the bounds of a save wait for (afterGrace).
func (e *Engine) resume(r *runState) {
	r.mu.Lock()
	m := &mut{e: e, r: r, now: e.clk.Now()}
	r.loadedAt, r.graceUntil = m.now, m.now.Add(e.opts.RestartGrace)
	r.jumpAdmissible = true
	if !r.terminal() {
		m.steps().armPreStep()
		m.snapshots().armInterval(false)
		m.snapshots().armSnapshotTimeout()
		m.steps().armSaveTimeout()
		m.missed().armMissed()
	}
	for _, w := range r.workers {
		if w.w.State == v1.WorkerState_WORKER_STATE_LIVE {
			m.workers().renewLease(w, e.opts.RestartGrace)
		}
	}
	m.flush()
	r.mu.Unlock()
}

func describeDeadline(r *runState) string {
	b, ok := r.mustSaveBy()
	if !ok {
		return "no deadline"
	}
	return "B = " + b.UTC().Format("2006-01-02T15:04:05Z07:00")
}
