package statuspage

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
	"github.com/snapcoord/snapcoord/internal/paging"
)

// Bounds on the workers table: a run's workers are bounded by
// --max-workers-per-run, but one page should stay quick to read.
const (
	maxWorkers   = 2000
	outcomeCells = 12 // the latest snapshots drawn per environment worker
)

// workerRow is one worker's lane in the workers table.
type workerRow struct {
	Name, Role, State, StateClass string
	Heartbeat, HeartbeatTitle     string
	Progress, ProgressClass       string
	Outcomes                      []outcomeCell
	Flags                         []string
	Class                         string // "worker", plus "lagging" and "silent" when flagged
}

// outcomeCell is one snapshot as one environment worker saw it.
type outcomeCell struct {
	Class, Title string
}

func (tl *timeline) loadWorkers(ctx context.Context, runs Runs) error {
	return paging.Each(func(token string) ([]*v1.Worker, string, error) {
		page, err := runs.ListWorkers(ctx, &v1.ListWorkersRequest{RunId: tl.run.GetRunId(), PageToken: token})
		if err != nil {
			return nil, "", err
		}
		next := page.GetNextPageToken()
		if len(tl.workers)+len(page.GetWorkers()) >= maxWorkers {
			next = "" // enough for one page; the table says how many are left out
		}
		return page.GetWorkers(), next, nil
	}, func(ws []*v1.Worker) { tl.workers = append(tl.workers, ws...) })
}

// workerView is what the page knows of each worker beyond its own record:
// the lease's length (to date the last heartbeat) and the other ranks'.
type workerView struct {
	now      time.Time
	leaseTTL time.Duration
	run      *v1.Run
	over     bool // the run ended: nobody is behind or silent any more
	// first is the lowest step any rank completed since the coordinator
	// started (0: none did); a rank with none may have reached at most it.
	first    int64
	outcomes map[string][]outcomeCell
	reports  map[string]*v1.SnapshotReport // each worker's latest
}

func (tl *timeline) workerRows(now time.Time, leaseTTL time.Duration) []workerRow {
	v := workerView{now: now, leaseTTL: leaseTTL, run: tl.run, over: tl.run.GetEndedAt() != nil}
	for _, w := range tl.workers {
		if s := w.GetLastStep(); s > 0 && (v.first == 0 || s < v.first) {
			v.first = s
		}
	}
	v.outcomes, v.reports = tl.outcomesByWorker(now)
	rows := make([]workerRow, 0, len(tl.workers))
	for _, w := range tl.workers {
		rows = append(rows, v.row(w))
	}
	return rows
}

func (v workerView) row(w *v1.Worker) workerRow {
	r := workerRow{Name: w.GetName(), State: apifacts.EnumLower(w.GetState()), Class: "worker"}
	r.StateClass = "worker-" + r.State
	r.Heartbeat, r.HeartbeatTitle = v.heartbeat(w)
	if silent := v.silence(w); silent != "" {
		r.Flags, r.Class = append(r.Flags, silent), r.Class+" silent"
	}
	if w.GetRole() == v1.WorkerRole_WORKER_ROLE_TRAINER {
		r.Role = fmt.Sprintf("trainer rank %d", w.GetRank())
		var behind string
		r.Progress, behind = v.rankProgress(w)
		if behind != "" {
			r.Flags, r.Class = append(r.Flags, behind), r.Class+" lagging"
		}
		return r
	}
	r.Role = "environment"
	r.Outcomes = v.outcomes[w.GetWorkerId()]
	r.Progress = "no report yet"
	if rep := v.reports[w.GetWorkerId()]; rep != nil {
		outcome := apifacts.EnumLower(rep.GetOutcome())
		r.Progress = fmt.Sprintf("%s %s ago (took %s)", outcome, human(v.now.Sub(rep.GetReportedAt().AsTime())), seconds(rep.GetDurationSeconds()))
		r.ProgressClass = cssName(outcome)
	}
	return r
}

// heartbeat dates the last heartbeat from the lease it renewed (the API
// gives only the lease's end).
func (v workerView) heartbeat(w *v1.Worker) (age, title string) {
	lease := w.GetLeaseExpiresAt().AsTime()
	title = "lease until " + lease.UTC().Format(timeLayout)
	if w.GetState() == v1.WorkerState_WORKER_STATE_LEFT {
		return "left", title
	}
	if v.leaseTTL <= 0 {
		return "lease " + until(lease.Sub(v.now)), title
	}
	last := lease.Add(-v.leaseTTL)
	if last.After(v.now) {
		// A lease longer than the TTL: the grace given to every worker at
		// a coordinator's start, not a heartbeat.
		return "none since the coordinator started", title
	}
	return human(v.now.Sub(last)) + " ago", title
}

// silence flags a worker whose lease lapsed while its run goes on.
func (v workerView) silence(w *v1.Worker) string {
	lease := w.GetLeaseExpiresAt().AsTime()
	lapsed := w.GetState() == v1.WorkerState_WORKER_STATE_LOST ||
		(w.GetState() == v1.WorkerState_WORKER_STATE_LIVE && lease.Before(v.now))
	if v.over || !lapsed {
		return ""
	}
	return "SILENT: no heartbeat, lease lapsed " + human(v.now.Sub(lease)) + " ago"
}

// rankProgress says where a rank is, and why it is behind if it is: its
// last completed step more than one below the run's.
func (v workerView) rankProgress(w *v1.Worker) (progress, behind string) {
	runStep := v.run.GetLastStep()
	active := !v.over && w.GetState() != v1.WorkerState_WORKER_STATE_LEFT
	switch step := w.GetLastStep(); {
	case step > 0:
		progress = fmt.Sprintf("step %d, %s ago", step, human(v.now.Sub(w.GetLastStepAt().AsTime())))
		if active && runStep-step > 1 {
			behind = fmt.Sprintf("BEHIND: %d steps behind the run's step %d", runStep-step, runStep)
		}
	case v.first > 0:
		progress = "no step since the coordinator started"
		// The run went on at least two steps past the first one seen since
		// then, none of them this rank's.
		if active && runStep > v.first+1 {
			behind = fmt.Sprintf("BEHIND: no step since the coordinator started, the run is at step %d", runStep)
		}
	default:
		progress = "-"
	}
	return progress, behind
}

// outcomesByWorker gives each environment worker its latest snapshots'
// outcomes, oldest first, and its latest report.
func (tl *timeline) outcomesByWorker(now time.Time) (map[string][]outcomeCell, map[string]*v1.SnapshotReport) {
	cells, latest := map[string][]outcomeCell{}, map[string]*v1.SnapshotReport{}
	for _, sn := range tl.snapshots {
		reported := map[string]*v1.SnapshotReport{}
		for _, rep := range sn.GetReports() {
			reported[rep.GetWorkerId()] = rep
			if l := latest[rep.GetWorkerId()]; l == nil || !rep.GetReportedAt().AsTime().Before(l.GetReportedAt().AsTime()) {
				latest[rep.GetWorkerId()] = rep
			}
		}
		ids := append([]string(nil), sn.GetExpectedWorkerIds()...)
		for id := range reported {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		for _, id := range ids {
			cells[id] = append(cells[id], cellOf(sn, reported[id], now))
		}
	}
	for id, cs := range cells {
		cells[id] = cs[max(0, len(cs)-outcomeCells):]
	}
	return cells, latest
}

// cellOf is one worker's part of a snapshot: its report's outcome, in
// flight, or "no report" once the snapshot ended without one.
func cellOf(sn *v1.Snapshot, rep *v1.SnapshotReport, now time.Time) outcomeCell {
	head := fmt.Sprintf("%s (%s, anchor step %d)", sn.GetSnapshotId(), apifacts.EnumLower(sn.GetReason()), sn.GetAnchorStep())
	switch {
	case rep != nil:
		outcome := apifacts.EnumLower(rep.GetOutcome())
		title := fmt.Sprintf("%s: %s in %s", head, outcome, seconds(rep.GetDurationSeconds()))
		if m := strings.TrimSpace(rep.GetMessage()); m != "" {
			title += ": " + m
		}
		return outcomeCell{Class: "cell " + cssName(outcome), Title: title}
	case sn.GetCompletedAt() == nil:
		return outcomeCell{Class: "cell in-flight", Title: fmt.Sprintf("%s: in flight for %s", head, human(now.Sub(sn.GetIssuedAt().AsTime())))}
	default:
		return outcomeCell{Class: "cell no-report", Title: head + ": no report (the snapshot ended " + apifacts.EnumLower(sn.GetOutcome()) + ")"}
	}
}
