package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
)

func snapshotNum(id string) int64 {
	n, _ := strconv.ParseInt(strings.TrimPrefix(id, "snap-"), 10, 64)
	return n
}

func snapshotID(n int64) string { return "snap-" + strconv.FormatInt(n, 10) }

func (m snapshotMut) snapshotTimeout() time.Duration {
	return time.Duration(m.r.rec.Run.Spec.RolloutCheckpointing.SnapshotTimeoutS) * time.Second
}

func (m snapshotMut) activeSnapshot() *v1.Snapshot {
	return m.r.snapshots[m.r.rec.ActiveSnapshotId]
}

// trySnapshot issues a snapshot outside the deadline unless one is in flight
// or no environment worker is live; a skip is recorded as an event.
func (m snapshotMut) trySnapshot(reason v1.SnapshotReason, anchor int64) {
	skip := ""
	if a := m.activeSnapshot(); a != nil {
		skip = "snapshot " + a.SnapshotId + " is still in flight"
	} else if len(m.workers().liveWorkers(v1.WorkerRole_WORKER_ROLE_ENVIRONMENT)) == 0 {
		skip = "no environment worker is live"
	}
	if skip != "" {
		m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_SNAPSHOT_TICK_SKIPPED, Step: anchor,
			Message: fmt.Sprintf("%s snapshot skipped: %s", reasonName(reason), skip)})
		return
	}
	m.issueSnapshot(reason, anchor, false, nil)
}

// issueSnapshot records a snapshot expected from every live environment
// worker and sends them the command.
func (m snapshotMut) issueSnapshot(reason v1.SnapshotReason, anchor int64, forced bool, mustFinish *timestamppb.Timestamp) *v1.Snapshot {
	r := m.r
	if a := m.activeSnapshot(); a != nil {
		// Only the deadline snapshot can overtake another: it supersedes it.
		m.completeSnapshot(a, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED, "superseded by the deadline snapshot")
	}
	r.rec.LastSnapshotNum++
	s := &v1.Snapshot{
		SnapshotId: snapshotID(r.rec.LastSnapshotNum), Reason: reason, AnchorStep: anchor,
		Forced: forced, IssuedAt: m.ts(), MustFinishBy: mustFinish,
	}
	for _, w := range m.workers().liveWorkers(v1.WorkerRole_WORKER_ROLE_ENVIRONMENT) {
		s.ExpectedWorkerIds = append(s.ExpectedWorkerIds, w.w.WorkerId)
	}
	r.snapshots[s.SnapshotId] = s
	r.snapOrder = append(r.snapOrder, s)
	r.rec.ActiveSnapshotId = s.SnapshotId
	m.putSnapshot(s)
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_SNAPSHOT_ISSUED, SnapshotId: s.SnapshotId, Step: anchor,
		Message: fmt.Sprintf("%s snapshot %s issued to %d environment workers (anchor step %d)",
			reasonName(reason), s.SnapshotId, len(s.ExpectedWorkerIds), anchor)})
	cmd := &v1.Command{Kind: &v1.Command_Snapshot{Snapshot: &v1.SnapshotCommand{
		SnapshotId: s.SnapshotId, Reason: reason, AnchorStep: anchor, Forced: forced}}}
	if reason == v1.SnapshotReason_SNAPSHOT_REASON_DEADLINE {
		cmd.Kind = &v1.Command_SaveAtDeadline{SaveAtDeadline: &v1.SaveAtDeadlineCommand{
			SnapshotId: s.SnapshotId, AnchorStep: anchor, MustFinishBy: mustFinish}}
	}
	m.log().command(v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, cmd)
	m.armSnapshotTimeout()
	return s
}

func (m snapshotMut) snapshotDeadline(s *v1.Snapshot) time.Time {
	if s.MustFinishBy != nil {
		return s.MustFinishBy.AsTime()
	}
	return s.IssuedAt.AsTime().Add(m.snapshotTimeout())
}

func (m snapshotMut) armSnapshotTimeout() {
	s := m.activeSnapshot()
	if s == nil {
		m.disarm(timerSnapshot)
		return
	}
	m.arm(timerSnapshot, m.afterGrace(m.snapshotDeadline(s)), func(m *mut) {
		if a := m.snapshots().activeSnapshot(); a == s {
			m.snapshots().completeSnapshot(s, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT,
				"not every environment worker reported by "+m.snapshots().snapshotDeadline(s).UTC().Format(time.RFC3339))
		}
	})
}

func (e *Engine) ReportSnapshot(ctx context.Context, req *v1.ReportSnapshotRequest) (*v1.ReportSnapshotResponse, error) {
	var state v1.RunState
	err := e.mutate(ctx, req.RunId, func(m *mut) error {
		w, err := m.r.worker(req.WorkerId, req.Incarnation, v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, "ReportSnapshot")
		if err != nil {
			return err
		}
		err = m.snapshots().snapshotReport(ctx, w, req)
		state = m.r.state()
		return err
	})
	if err != nil {
		return nil, err
	}
	return &v1.ReportSnapshotResponse{RunState: state}, nil
}

func (m snapshotMut) snapshotReport(ctx context.Context, w *workerState, req *v1.ReportSnapshotRequest) error {
	r := m.r
	s := r.snapshots[req.SnapshotId]
	if s == nil {
		return errorf(ErrNotFound, "snapshot_id: snapshot %q was never issued in run %q", req.SnapshotId, r.id)
	}
	if s.CompletedAt != nil {
		return m.lateSnapshotReport(ctx, w, req)
	}
	x := r.reportIndex(s)
	if x.reported[w.w.WorkerId] != nil {
		return nil // a retry: the first report stands
	}
	if r.terminal() {
		// terminate closes the snapshot in flight; a terminal run with one
		// open comes from a data file written before it did.
		return errTerminalReport(r)
	}
	rep := m.newSnapshotReport(w, req)
	s.Reports = append(s.Reports, rep)
	x.add(rep)
	m.b.PutSnapshotReport(r.id, s.SnapshotId, rep)
	m.checkSnapshotDone(s)
	return nil
}

func (m snapshotMut) newSnapshotReport(w *workerState, req *v1.ReportSnapshotRequest) *v1.SnapshotReport {
	return &v1.SnapshotReport{WorkerId: w.w.WorkerId, Outcome: req.Outcome,
		DurationSeconds: req.DurationSeconds, Message: oneLine(req.Message), ReportedAt: m.ts()}
}

func errTerminalReport(r *runState) error {
	return errorf(ErrFailedPrecondition, "run %q is %s: no new snapshot reports", r.id, stateName(r.state()))
}

// lateSnapshotReport records a report on a completed snapshot, whose
// reports are no longer in memory (see summarize). It changes no outcome;
// the store keeps the worker's first report. In a terminal run only a retry
// of a stored report is accepted: the store is read once every earlier
// commit of the run is done, so a retry racing its first attempt's commit
// still finds it.
func (m snapshotMut) lateSnapshotReport(ctx context.Context, w *workerState, req *v1.ReportSnapshotRequest) error {
	r := m.r
	if r.terminal() {
		if err := m.e.wait(ctx, r.last); err != nil {
			return err
		}
		rep, err := m.e.st.SnapshotReport(r.id, req.SnapshotId, w.w.WorkerId)
		if err != nil {
			return fmt.Errorf("run %q: %w", r.id, err)
		}
		if rep == nil {
			return errTerminalReport(r)
		}
		return nil
	}
	m.b.PutSnapshotReport(r.id, req.SnapshotId, m.newSnapshotReport(w, req))
	return nil
}

// checkSnapshotDone completes the snapshot once every expected worker that
// is still live has reported, or at the first invariant failure. It runs at
// every report, so it costs O(1) in the usual case rather than O(workers):
// a 10,000-worker snapshot would otherwise cost 10^8 steps under the run's
// lock.
func (m snapshotMut) checkSnapshotDone(s *v1.Snapshot) {
	x := m.r.reportIndex(s)
	if rep := x.invariant; rep != nil {
		m.completeSnapshot(s, rep.Outcome, fmt.Sprintf("worker %s: %s", rep.WorkerId, clip(rep.Message, maxQuotedMessage)))
		return
	}
	for id := range x.waiting {
		if w := m.r.workers[id]; w != nil && w.w.State == v1.WorkerState_WORKER_STATE_LIVE {
			return // still waiting for a live worker
		}
	}
	outcome, why := combineOutcomes(s, x.reported, m.r.workers)
	m.completeSnapshot(s, outcome, why)
}

// reportIndex is a snapshot's reports by worker, and the expected workers
// that have not reported yet.
type reportIndex struct {
	reported  map[string]*v1.SnapshotReport
	waiting   map[string]struct{}
	invariant *v1.SnapshotReport // the first INVARIANT_FAILURE, in report order
}

func (x *reportIndex) add(rep *v1.SnapshotReport) {
	x.reported[rep.WorkerId] = rep
	delete(x.waiting, rep.WorkerId)
	if x.invariant == nil && rep.Outcome == v1.SnapshotOutcome_SNAPSHOT_OUTCOME_INVARIANT_FAILURE {
		x.invariant = rep
	}
}

// reportIndex returns the index of s, a snapshot in flight, building it
// from s.Reports the first time (a new snapshot, or one loaded after a
// restart). completeSnapshot drops it.
func (r *runState) reportIndex(s *v1.Snapshot) *reportIndex {
	if x := r.reportIdx[s.SnapshotId]; x != nil {
		return x
	}
	x := &reportIndex{
		reported: make(map[string]*v1.SnapshotReport, len(s.ExpectedWorkerIds)),
		waiting:  make(map[string]struct{}, len(s.ExpectedWorkerIds)),
	}
	for _, id := range s.ExpectedWorkerIds {
		x.waiting[id] = struct{}{}
	}
	for _, rep := range s.Reports {
		x.add(rep)
	}
	if r.reportIdx == nil {
		r.reportIdx = map[string]*reportIndex{}
	}
	r.reportIdx[s.SnapshotId] = x
	return x
}

// summarize drops a completed snapshot's expected workers and reports from
// memory once they are stored: nothing decided later reads them, and a long
// run of a big job would otherwise hold every snapshot's reports (about
// 2 MB per snapshot of 10,000 workers). ListSnapshots reads them back from
// the store; store.Load returns completed snapshots the same way.
func summarize(s *v1.Snapshot) {
	s.ExpectedWorkerIds = nil
	s.Reports = nil
}

// combineOutcomes is the snapshot's outcome from its reports: any missing or
// TIMEOUT -> TIMEOUT, else any IO_ERROR, else all SKIPPED (or a forced
// snapshot with a skip) -> SKIPPED, else SAVED.
func combineOutcomes(s *v1.Snapshot, reported map[string]*v1.SnapshotReport, workers map[string]*workerState) (v1.SnapshotOutcome, string) {
	var saved, skipped, ioErr, timeout []string
	for _, id := range s.ExpectedWorkerIds {
		rep := reported[id]
		switch {
		case rep == nil:
			timeout = append(timeout, id+" ("+workerStateName(workers[id])+")")
		case rep.Outcome == v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED:
			saved = append(saved, id)
		case rep.Outcome == v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED:
			skipped = append(skipped, id)
		case rep.Outcome == v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR:
			ioErr = append(ioErr, id+": "+clip(rep.Message, maxQuotedMessage))
		default:
			timeout = append(timeout, id)
		}
	}
	switch {
	case len(timeout) > 0:
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT, "no report in time from " + some(timeout, ", ")
	case len(ioErr) > 0:
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, "I/O error on " + some(ioErr, "; ")
	case len(s.ExpectedWorkerIds) == 0:
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED, "no environment worker was live"
	case len(saved) == 0 || s.Forced && len(skipped) > 0:
		return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED, "skipped by " + some(skipped, ", ")
	}
	return v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, fmt.Sprintf("saved by %d environment workers", len(saved))
}

// A snapshot's message names the workers that decided its outcome, and it
// goes on into the run's failure_message, an event and every worker's Stop.
// Naming all of 10,000 workers, each with its 4 KiB of error, made a run
// too big to read (GetRun past the 4 MiB a client accepts) and its Stop
// undeliverable: the first few say enough.
const (
	maxNamedWorkers  = 5
	maxQuotedMessage = 256
)

// oneLine replaces control characters in free text from a client (a
// report's message, a reason) by spaces. The text goes on into events,
// failure_message and Stop reasons: a NUL there made the sidecar's
// --on-stop hook fail (no NUL in an environment variable), and a newline or
// an escape sequence forged lines in `snapctl events`.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// some joins the first maxNamedWorkers items and says how many more.
func some(items []string, sep string) string {
	if len(items) <= maxNamedWorkers {
		return strings.Join(items, sep)
	}
	return fmt.Sprintf("%s%sand %d more", strings.Join(items[:maxNamedWorkers], sep), sep, len(items)-maxNamedWorkers)
}

// clip cuts s to at most n bytes, on a character boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

func workerStateName(w *workerState) string {
	if w == nil {
		return "unknown"
	}
	return apifacts.EnumLower(w.w.State)
}

// completeSnapshot closes a snapshot and applies its outcome to the run.
func (m snapshotMut) completeSnapshot(s *v1.Snapshot, outcome v1.SnapshotOutcome, why string) {
	r := m.r
	excused := outcome == v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT && s.SnapshotId != r.rec.DeadlineSnapshotId &&
		onlyGoneWorkersMissing(s, r.reportIndex(s).reported, r.workers)
	if excused {
		why += "; not counted toward max_consecutive_failures: only workers no longer live did not report"
	}
	reported := longestReport(s) // before closeSnapshot drops the reports
	m.closeSnapshot(s, outcome, why)
	if outcome == v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		m.recordReserve(m.reserveSeconds(s, reported))
		m.history().durableOnSnapshot(s)
	}
	m.safety().safetySnapshotCompleted(s)
	if s.SnapshotId == r.rec.DeadlineSnapshotId {
		m.finishDeadline(s)
		return
	}
	if !excused {
		m.countFailures(s)
	}
}

// closeSnapshot records the snapshot's outcome and ends it as the one in
// flight, without consequences for the run.
func (m snapshotMut) closeSnapshot(s *v1.Snapshot, outcome v1.SnapshotOutcome, why string) {
	r := m.r
	s.CompletedAt = m.ts()
	s.Outcome = outcome
	s.Message = why
	s.DurationSeconds = m.now.Sub(s.IssuedAt.AsTime()).Seconds()
	if n := len(s.Reports); n > 0 && outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT {
		// Issue -> last report; reports are kept in the order they came.
		s.DurationSeconds = s.Reports[n-1].ReportedAt.AsTime().Sub(s.IssuedAt.AsTime()).Seconds()
	}
	m.putSnapshot(s)
	summarize(s)
	if r.rec.ActiveSnapshotId == s.SnapshotId {
		r.rec.ActiveSnapshotId = ""
		m.disarm(timerSnapshot)
	}
	delete(r.reportIdx, s.SnapshotId)
	m.log().event(&v1.RunEvent{Type: v1.RunEventType_RUN_EVENT_TYPE_SNAPSHOT_COMPLETED, SnapshotId: s.SnapshotId, Step: s.AnchorStep,
		Message: fmt.Sprintf("snapshot %s %s after %.3g s: %s", s.SnapshotId, outcomeName(outcome), s.DurationSeconds, why)})
	runID, id, reason, dur := r.id, s.SnapshotId, s.Reason, s.DurationSeconds
	m.observe(func(ctx context.Context) { m.e.obs.SnapshotCompleted(ctx, runID, id, reason, outcome, dur) })
}

// onlyGoneWorkersMissing: every worker still live reported SAVED or
// SKIPPED, and the reports missing are from workers lost or gone since the
// snapshot was issued. On a big cluster workers come and go (preemptions, a
// node rebooting); that is not snapshots failing, and must not fail a run
// through max_consecutive_failures. The snapshot is still TIMEOUT: those
// workers' state was not saved.
func onlyGoneWorkersMissing(s *v1.Snapshot, reported map[string]*v1.SnapshotReport, workers map[string]*workerState) bool {
	missing := false
	for _, id := range s.ExpectedWorkerIds {
		switch rep := reported[id]; {
		case rep == nil:
			if w := workers[id]; w == nil || w.w.State == v1.WorkerState_WORKER_STATE_LIVE {
				return false
			}
			missing = true
		case rep.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED && rep.Outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED:
			return false
		}
	}
	return missing
}

// reserveSeconds is what a SAVED snapshot adds to R: its duration, from
// issue to the last report; but for one issued before this process loaded
// the run (the coordinator restarted meanwhile), reported, the longest
// duration a worker reported. The outage, and the command's delivery after
// it, are no part of what a save takes, and would make every deadline fire
// that much earlier for the next reserve window.
func (m snapshotMut) reserveSeconds(s *v1.Snapshot, reported float64) float64 {
	if s.IssuedAt.AsTime().Before(m.r.loadedAt) {
		return reported
	}
	return s.DurationSeconds
}

func longestReport(s *v1.Snapshot) float64 {
	longest := 0.0
	for _, rep := range s.Reports {
		longest = max(longest, rep.DurationSeconds)
	}
	return longest
}

// recordReserve feeds R: the window keeps the latest SAVED durations.
func (m snapshotMut) recordReserve(sec float64) {
	r := m.r
	w := int(r.rec.Run.Spec.Reserve.Window)
	r.rec.SavedSnapshotSeconds = append(r.rec.SavedSnapshotSeconds, sec)
	if n := len(r.rec.SavedSnapshotSeconds); n > w {
		r.rec.SavedSnapshotSeconds = append([]float64(nil), r.rec.SavedSnapshotSeconds[n-w:]...)
	}
	m.history().recordSnapshot(sec)
	m.dirty()
	m.steps().armPreStep() // R moved, and with it the pre-step deadline
}

func (m snapshotMut) countFailures(s *v1.Snapshot) {
	r := m.r
	limit := r.rec.Run.Spec.RolloutCheckpointing.MaxConsecutiveFailures
	switch s.Outcome {
	case v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED:
		r.rec.ConsecutiveFailures = 0
	case v1.SnapshotOutcome_SNAPSHOT_OUTCOME_INVARIANT_FAILURE:
		m.failRun("invariant failure in snapshot " + s.SnapshotId + ": " + s.Message)
	case v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT:
		r.rec.ConsecutiveFailures++
		// Once the deadline fired, the deadline snapshot decides how the run
		// ends (even its own I/O error only warns): a regular snapshot still
		// in flight must not fail the run while the trainers save.
		if r.rec.ConsecutiveFailures >= limit && !r.fired() {
			m.failRun(fmt.Sprintf("%d consecutive snapshot failures (max_consecutive_failures %d); last: %s",
				r.rec.ConsecutiveFailures, limit, s.Message))
		}
	}
	m.dirty()
}

// armInterval arms the next interval snapshot. fresh restarts the period
// (a new run); otherwise the stored due time stands (a restart).
func (m snapshotMut) armInterval(fresh bool) {
	r := m.r
	iv := r.rec.Run.Spec.RolloutCheckpointing.SnapshotAttemptIntervalS
	if iv == nil || r.fired() || r.terminal() {
		m.disarm(timerInterval)
		return
	}
	period := time.Duration(*iv) * time.Second
	if fresh || r.rec.NextIntervalAt == nil {
		r.rec.NextIntervalAt = timestamppb.New(m.now.Add(period))
		m.dirty()
	}
	m.arm(timerInterval, r.rec.NextIntervalAt.AsTime(), func(m *mut) {
		if m.r.fired() || m.r.terminal() {
			return
		}
		m.snapshots().trySnapshot(v1.SnapshotReason_SNAPSHOT_REASON_INTERVAL, m.r.rec.Run.LastPublishedStep)
		m.snapshots().armInterval(true)
	})
}

func reasonName(r v1.SnapshotReason) string {
	return strings.ReplaceAll(apifacts.EnumLower(r), "_", " ")
}

func outcomeName(o v1.SnapshotOutcome) string {
	return apifacts.EnumName(o)
}

func (m snapshotMut) putSnapshot(s *v1.Snapshot) { m.b.PutSnapshot(m.r.id, s) }
