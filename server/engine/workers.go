package engine

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/clock"
)

// worker returns the calling worker, checking that its role may make the
// call and that it is not a superseded process (see current): refused
// before anything changes.
func (r *runState) worker(id string, incarnation int64, role v1.WorkerRole, rpc string) (*workerState, error) {
	w := r.workers[id]
	if w == nil {
		return nil, errorf(ErrNotFound, "worker_id: worker %q is not registered in run %q", id, r.id)
	}
	if role != v1.WorkerRole_WORKER_ROLE_UNSPECIFIED && w.w.Role != role {
		return nil, errorf(ErrInvalidArgument, "worker_id: %s is registered as %s; %s is for %s",
			id, w.w.Role, rpc, roleName(role))
	}
	if err := w.current(incarnation); err != nil {
		return nil, err
	}
	if err := r.displaced(w); err != nil {
		return nil, err
	}
	return w, nil
}

// displaced refuses a trainer whose rank another process took over
// (releaseRank), like an older incarnation of its own name: a process cut
// off from the network, not dead, would otherwise go on acting as the
// rank, and its SAVED, its steps and its FinishRun count as the rank's.
func (r *runState) displaced(w *workerState) error {
	if w.w.Role != v1.WorkerRole_WORKER_ROLE_TRAINER || w.w.State != v1.WorkerState_WORKER_STATE_LEFT {
		return nil
	}
	for _, o := range r.workers {
		if o != w && o.w.Role == v1.WorkerRole_WORKER_ROLE_TRAINER && o.w.Rank == w.w.Rank &&
			o.w.State != v1.WorkerState_WORKER_STATE_LEFT {
			return &Error{Kind: ErrFailedPrecondition, Reason: ReasonWorkerSuperseded, Msg: fmt.Sprintf(
				"worker_id: %s (%q) left rank %d, which %s (%q) holds now; this process was superseded and must stop",
				w.w.WorkerId, w.w.Name, w.w.Rank, o.w.WorkerId, o.w.Name)}
		}
	}
	return nil
}

// current checks that a call comes from the worker's current incarnation,
// when the call names one (0 does not).
func (w *workerState) current(incarnation int64) error {
	if incarnation == 0 || incarnation == w.w.Incarnation {
		return nil
	}
	return &Error{Kind: ErrFailedPrecondition, Reason: ReasonWorkerSuperseded, Msg: fmt.Sprintf(
		"incarnation: %d of worker %s (%q) is not current: the name registered again as incarnation %d; a process still holding %d was superseded and must stop",
		incarnation, w.w.WorkerId, w.w.Name, w.w.Incarnation, incarnation)}
}

func roleName(r v1.WorkerRole) string {
	if r == v1.WorkerRole_WORKER_ROLE_TRAINER {
		return "trainer ranks"
	}
	return "environment workers"
}

func (m workerMut) liveWorkers(role v1.WorkerRole) []*workerState {
	var out []*workerState
	for _, w := range m.r.workers {
		if w.w.Role == role && w.w.State == v1.WorkerState_WORKER_STATE_LIVE {
			out = append(out, w)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].w.WorkerId < out[j].w.WorkerId })
	return out
}

func (e *Engine) RegisterWorker(ctx context.Context, req *v1.RegisterWorkerRequest) (*v1.RegisterWorkerResponse, error) {
	resp := &v1.RegisterWorkerResponse{
		HeartbeatInterval: durationpb.New(e.opts.HeartbeatInterval),
		LeaseTtl:          durationpb.New(e.opts.LeaseTTL),
	}
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		w, err := m.workers().register(req)
		if err != nil {
			return err
		}
		resp.WorkerId, resp.Incarnation = w.w.WorkerId, w.w.Incarnation
		resp.RunState, resp.LastCommandSeq = m.r.state(), m.r.rec.LastCommandSeq
		resp.ResumeAfterSeq = m.r.resumeAfter(w)
		resp.LastCheckpointStep = m.r.rec.Run.LastPublishedStep
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (m workerMut) register(req *v1.RegisterWorkerRequest) (*workerState, error) {
	r := m.r
	// A superseded process hears so whatever the run's state: it must stop,
	// not take "the run is over" for a reason to try again.
	w := r.byName[req.Name]
	if w != nil && req.Incarnation != 0 && req.Incarnation == w.w.ReplacedIncarnation && req.Incarnation != w.w.Incarnation {
		// The repeat of a re-register whose answer was lost. (A name new
		// to the coordinator that registered with the incarnation it held,
		// after a restore from backup, replaced its own incarnation: a
		// re-register with it is a new one.)
		return w, nil
	}
	var base int64 // the incarnation the new one follows
	if req.Incarnation == math.MaxInt64 {
		return nil, errorf(ErrInvalidArgument, "incarnation: %d has no successor", req.Incarnation)
	}
	if w != nil {
		if req.Incarnation <= w.w.Incarnation {
			if err := w.current(req.Incarnation); err != nil {
				return nil, err
			}
		}
		// An incarnation ahead of this state was never issued by it, which
		// only counts up: the state went back (restored from a backup) to
		// before this process registered again. The process was not
		// superseded; its new incarnation follows the one it holds, so
		// that it is above every one the process held.
		base = max(w.w.Incarnation, req.Incarnation)
	}
	if r.terminal() {
		return nil, errorf(ErrFailedPrecondition, "run %q is %s: it takes no new workers", r.id, stateName(r.state()))
	}
	if err := m.checkRank(req); err != nil {
		return nil, err
	}
	if w == nil {
		if len(r.workers) >= m.e.opts.MaxWorkersPerRun && !m.takesOverRank(req) {
			return nil, errorf(ErrResourceExhausted, "limit max_workers_per_run (%d) reached in run %q", m.e.opts.MaxWorkersPerRun, r.id)
		}
		r.rec.LastWorkerNum++
		w = &workerState{w: &v1.Worker{WorkerId: workerID(r.id, r.rec.LastWorkerNum), Name: req.Name,
			Role: req.Role, Rank: req.Rank}}
		r.workers[w.w.WorkerId] = w
		r.byName[w.w.Name] = w
		m.dirty()
	}
	m.releaseRank(req, w)
	w.w.ReplacedIncarnation = req.Incarnation
	w.w.Incarnation = base + 1
	if w.w.Incarnation > 1 {
		m.notify.commands = true // the previous incarnation's streams and polls must end
	}
	w.w.State = v1.WorkerState_WORKER_STATE_LIVE
	w.w.RegisteredAt = m.ts()
	m.renewLease(w, m.e.opts.LeaseTTL)
	m.putWorker(w)
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WORKER_REGISTERED, WorkerId: w.w.WorkerId,
		Message: fmt.Sprintf("%s %q registered as %s (incarnation %d)", roleWord(w.w), w.w.Name, w.w.WorkerId, w.w.Incarnation)})
	return w, nil
}

// resumeAfter is where a worker registering starts reading commands: the
// end of the log, or just before a command that still waits for this
// worker. A worker process that restarts in the middle of a save must still
// do it: an environment worker the snapshot in flight still expects a
// report from (SaveAtDeadline above all), a trainer rank while the fired
// step's checkpoint waits to be published (deferred finalize).
func (r *runState) resumeAfter(w *workerState) int64 {
	pending := r.pendingFor(w)
	if pending == nil {
		return r.rec.LastCommandSeq
	}
	for i := len(r.commands) - 1; i >= 0; i-- {
		if pending(r.commands[i]) {
			return r.commands[i].Seq - 1
		}
	}
	return r.rec.LastCommandSeq
}

// pendingFor matches the command still waiting for w, if any.
func (r *runState) pendingFor(w *workerState) func(*v1.Command) bool {
	switch w.w.Role {
	case v1.WorkerRole_WORKER_ROLE_ENVIRONMENT:
		s := r.snapshots[r.rec.ActiveSnapshotId]
		if s == nil {
			return nil
		}
		if _, waiting := r.reportIndex(s).waiting[w.w.WorkerId]; !waiting {
			return nil
		}
		return func(c *v1.Command) bool {
			return c.GetSnapshot().GetSnapshotId() == s.SnapshotId || c.GetSaveAtDeadline().GetSnapshotId() == s.SnapshotId
		}
	case v1.WorkerRole_WORKER_ROLE_TRAINER:
		step := r.rec.Run.FiredAtStep
		// The fired step is kept in memory: see trimSteps.
		if !r.rec.PublishRequested || r.terminal() || r.steps[step].GetPublished() {
			return nil
		}
		return func(c *v1.Command) bool {
			return c.GetPublishCheckpoint() != nil && c.GetPublishCheckpoint().GetStep() == step
		}
	}
	return nil
}

// workerID names a run's nth worker. The run's tag keeps ids unique across
// runs: a bare "w<n>" would name worker n of every run, so a worker id of
// run A used with run B would act as one of B's workers instead of being
// NOT_FOUND there (nothing of one run may affect another).
func workerID(runID string, n int64) string {
	h := sha256.Sum256([]byte(runID))
	return fmt.Sprintf("w%d-%x", n, h[:6])
}

// checkRank: a trainer's rank is within the world and not held by another
// live process; a re-register keeps its role and rank.
func (m workerMut) checkRank(req *v1.RegisterWorkerRequest) error {
	r := m.r
	if req.Role == v1.WorkerRole_WORKER_ROLE_ENVIRONMENT && req.Rank != 0 {
		return errorf(ErrInvalidArgument, "rank: must be 0 for WORKER_ROLE_ENVIRONMENT")
	}
	if prev := r.byName[req.Name]; prev != nil && (prev.w.Role != req.Role || prev.w.Rank != req.Rank) {
		return errorf(ErrAlreadyExists, "name: %q is registered as %s rank %d", req.Name, prev.w.Role, prev.w.Rank)
	}
	if req.Role == v1.WorkerRole_WORKER_ROLE_ENVIRONMENT {
		return nil
	}
	if size := r.rec.Run.Spec.TrainerWorldSize; req.Rank >= size {
		return errorf(ErrInvalidArgument, "rank: %d is outside the run's trainer_world_size %d (ranks 0..%d)", req.Rank, size, size-1)
	}
	for _, w := range r.workers {
		if w.w.Role == v1.WorkerRole_WORKER_ROLE_TRAINER && w.w.Rank == req.Rank && w.w.Name != req.Name &&
			w.w.State == v1.WorkerState_WORKER_STATE_LIVE {
			return errorf(ErrAlreadyExists, "rank: %d is held by live worker %s (%q)", req.Rank, w.w.WorkerId, w.w.Name)
		}
	}
	return nil
}

// takesOverRank: a trainer registering under a new name for a rank another
// name held (checkRank made sure that one is not live). The run's live
// workers do not grow, so max_workers_per_run does not apply: a limit sized
// to the job must not stop a rank restarting on another node.
func (m workerMut) takesOverRank(req *v1.RegisterWorkerRequest) bool {
	if req.Role != v1.WorkerRole_WORKER_ROLE_TRAINER {
		return false
	}
	for _, w := range m.r.workers {
		if w.w.Role == req.Role && w.w.Rank == req.Rank {
			return true
		}
	}
	return false
}

// releaseRank retires a lost or departed holder of the rank taken over by a
// process with another name (a rank restarted on another node).
func (m workerMut) releaseRank(req *v1.RegisterWorkerRequest, taker *workerState) {
	if req.Role != v1.WorkerRole_WORKER_ROLE_TRAINER {
		return
	}
	for _, w := range m.r.workers {
		if w != taker && w.w.Role == req.Role && w.w.Rank == req.Rank && w.w.State != v1.WorkerState_WORKER_STATE_LEFT {
			m.leave(w, fmt.Sprintf("rank %d taken over by %q", req.Rank, req.Name))
			m.notify.commands = true // its streams and polls must end: see displaced
		}
	}
}

func roleWord(w *v1.Worker) string {
	if w.Role == v1.WorkerRole_WORKER_ROLE_TRAINER {
		return fmt.Sprintf("trainer rank %d", w.Rank)
	}
	return "environment worker"
}

// renewLease extends the lease in memory and makes sure a timer will check it.
func (m workerMut) renewLease(w *workerState, ttl time.Duration) {
	w.lease = m.now.Add(ttl)
	w.w.LeaseExpiresAt = timestamppb.New(w.lease)
	if w.timer == nil {
		m.armLease(w, ttl)
	}
}

// armLease checks the lease when it may have lapsed. Heartbeats only move
// w.lease; the timer re-arms itself for the remainder, so a heartbeat costs
// no timer operation.
func (m workerMut) armLease(w *workerState, d time.Duration) {
	r, e := m.r, m.e
	var t clock.Timer
	t = e.clk.AfterFunc(d, func() {
		e.onTimer(r, func(m *mut) {
			if w.timer != t {
				// Stopped (the worker left) or replaced (it registered
				// again) while this callback waited for the run's lock:
				// re-arming here would start a second chain of timers.
				return
			}
			w.timer = nil
			// In a finished run too: a worker that went away without
			// deregistering would otherwise be LIVE for good.
			if w.w.State != v1.WorkerState_WORKER_STATE_LIVE {
				return
			}
			if left := w.lease.Sub(m.now); left > 0 {
				m.workers().armLease(w, left)
				return
			}
			m.workers().lose(w)
		})
	})
	w.timer = t
}

func (m workerMut) lose(w *workerState) {
	w.w.State = v1.WorkerState_WORKER_STATE_LOST
	m.putWorker(w)
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WORKER_LOST, WorkerId: w.w.WorkerId,
		Message: fmt.Sprintf("%s %q (%s) lost: no heartbeat for %s", roleWord(w.w), w.w.Name, w.w.WorkerId, m.e.opts.LeaseTTL)})
	m.workerGone()
}

func (m workerMut) leave(w *workerState, why string) {
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	w.w.State = v1.WorkerState_WORKER_STATE_LEFT
	m.putWorker(w)
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WORKER_LEFT, WorkerId: w.w.WorkerId,
		Message: fmt.Sprintf("%s %q (%s) left: %s", roleWord(w.w), w.w.Name, w.w.WorkerId, why)})
	if w.w.Role == v1.WorkerRole_WORKER_ROLE_TRAINER {
		m.steps().warnUnsaved([]int32{w.w.Rank}, func(rank string, step int64) string {
			return fmt.Sprintf("rank %s left without reporting its checkpoint of step %d, which the deadline save waits for", rank, step)
		})
	}
	m.workerGone()
}

// workerGone lets a snapshot that only waited for a departed worker finish.
// A terminal run has none in flight; a data file written before terminate
// closed it may still name one, which must stay as it is.
func (m workerMut) workerGone() {
	if s := m.snapshots().activeSnapshot(); s != nil && !m.r.terminal() {
		m.snapshots().checkSnapshotDone(s)
	}
}

func (e *Engine) Heartbeat(ctx context.Context, req *v1.HeartbeatRequest) (*v1.HeartbeatResponse, error) {
	resp := &v1.HeartbeatResponse{}
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		w, err := m.r.worker(req.WorkerId, req.Incarnation, v1.WorkerRole_WORKER_ROLE_UNSPECIFIED, "Heartbeat")
		if err != nil {
			return err
		}
		if w.w.State == v1.WorkerState_WORKER_STATE_LEFT {
			return errorf(ErrFailedPrecondition, "worker_id: %s deregistered; register again", w.w.WorkerId)
		}
		if w.w.State == v1.WorkerState_WORKER_STATE_LOST && !m.r.terminal() {
			w.w.State = v1.WorkerState_WORKER_STATE_LIVE
			m.workers().putWorker(w)
			m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_WORKER_REGISTERED, WorkerId: w.w.WorkerId,
				Message: fmt.Sprintf("%s %q (%s) is back after being lost", roleWord(w.w), w.w.Name, w.w.WorkerId)})
		}
		m.workers().renewLease(w, m.e.opts.LeaseTTL)
		resp.RunState, resp.LeaseExpiresAt = m.r.state(), w.w.LeaseExpiresAt
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (e *Engine) DeregisterWorker(ctx context.Context, req *v1.DeregisterWorkerRequest) (*v1.DeregisterWorkerResponse, error) {
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		w, err := m.r.worker(req.WorkerId, req.Incarnation, v1.WorkerRole_WORKER_ROLE_UNSPECIFIED, "DeregisterWorker")
		if err != nil || w.w.State == v1.WorkerState_WORKER_STATE_LEFT {
			return err
		}
		m.workers().leave(w, "deregistered")
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &v1.DeregisterWorkerResponse{}, nil
}

func (e *Engine) ListWorkers(ctx context.Context, req *v1.ListWorkersRequest) (*v1.ListWorkersResponse, error) {
	after, err := decodeWorkerToken(req.PageToken)
	if err != nil {
		return nil, err
	}
	size := int(req.PageSize)
	if size == 0 {
		size = maxWorkerPage
	}
	resp := &v1.ListWorkersResponse{}
	err = e.view(ctx, req.RunId, func(r *runState) error {
		all := make([]*workerState, 0, len(r.workers))
		for _, w := range r.workers {
			all = append(all, w)
		}
		slices.SortFunc(all, func(a, b *workerState) int { return compareWorkers(listKey(a.w), listKey(b.w)) })
		i := 0
		if after != nil {
			i, _ = slices.BinarySearchFunc(all, *after, func(w *workerState, k workerKey) int { return compareWorkers(listKey(w.w), k) })
			if i < len(all) && listKey(all[i].w) == *after {
				i++
			}
		}
		for _, w := range all[i:min(i+size, len(all))] {
			resp.Workers = append(resp.Workers, w.view())
		}
		if i+size < len(all) {
			resp.NextPageToken = encodeWorkerToken(listKey(all[i+size-1].w))
		}
		return nil
	})
	return resp, err
}

// maxWorkerPage bounds a ListWorkers page; at most about 400 bytes a worker
// (a 128-character name), a page stays under 1 MiB.
const maxWorkerPage = 1000

// workerKey is ListWorkers' order: trainers by rank, then environment
// workers by name.
type workerKey struct {
	role v1.WorkerRole
	rank int32
	name string
}

func listKey(w *v1.Worker) workerKey { return workerKey{w.Role, w.Rank, w.Name} }

func compareWorkers(a, b workerKey) int {
	return cmp.Or(cmp.Compare(a.role, b.role), cmp.Compare(a.rank, b.rank), strings.Compare(a.name, b.name))
}

// A worker page token's key is the last listed worker's role, rank and
// name, which has no spaces.
func encodeWorkerToken(k workerKey) string {
	return encodePageToken(k.String())
}

func (k workerKey) String() string { return fmt.Sprintf("%d %d %s", k.role, k.rank, k.name) }

// decodeWorkerToken returns the key in tok, nil for the first page.
func decodeWorkerToken(tok string) (*workerKey, error) {
	var k workerKey
	key, err := decodePageToken(tok, "ListWorkers", func(key string) bool {
		_, err := fmt.Sscanf(key, "%d %d %s", &k.role, &k.rank, &k.name)
		return err == nil && k.String() == key
	})
	if key == "" {
		return nil, err
	}
	return &k, nil
}

func (m workerMut) putWorker(w *workerState) { m.b.PutWorker(m.r.id, w.w) }

// rankName is `3 (w4-…, "rank-3", LOST)` for the worker that holds the rank
// or, if none does, the one that held it last (LEFT), else "3 (never
// registered)".
func (m workerMut) rankName(rank int32) string {
	var held *workerState
	for _, w := range m.r.workers {
		if w.w.Role != v1.WorkerRole_WORKER_ROLE_TRAINER || w.w.Rank != rank {
			continue
		}
		if w.w.State != v1.WorkerState_WORKER_STATE_LEFT {
			held = w
			break
		}
		if held == nil || w.w.Incarnation > held.w.Incarnation {
			held = w
		}
	}
	if held == nil {
		return fmt.Sprintf("%d (never registered)", rank)
	}
	return fmt.Sprintf("%d (%s, %q, %s)", rank, held.w.WorkerId, held.w.Name, workerStateName(held))
}
