package main

import (
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// acks is the client-side log of every acknowledged write: what each
// writer was told succeeded. After every restart each entry must still be
// true of the coordinator's state.
type acks struct {
	mu   sync.Mutex
	runs map[string]*runAcks
	// lastAck is when each writer (by name) last had a write acknowledged
	// or, for environment workers, last received a command.
	lastAck map[string]time.Time
	// violations are problems seen at acknowledgement time: two ranks told
	// different decisions for one step.
	violations []string

	n counts
}

type counts struct {
	Runs, Registrations, Decisions, DecisionReads, CheckpointReports, SnapshotReports int
}

func (c counts) writes() int {
	return c.Runs + c.Registrations + c.Decisions + c.CheckpointReports + c.SnapshotReports
}

type runAcks struct {
	id        string
	worldSize int
	decisions map[int64]*v1.Decision // the first decision acknowledged per step
	saved     map[int64]map[int32]bool
	// snapReports: snapshot id -> worker id -> outcome acknowledged.
	snapReports map[string]map[string]v1.SnapshotOutcome
	// workers: worker id -> incarnation acknowledged at registration.
	workers map[string]int64
}

func newAcks() *acks {
	return &acks{runs: map[string]*runAcks{}, lastAck: map[string]time.Time{}}
}

func (a *acks) run(id string, worldSize int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.runs[id] = &runAcks{id: id, worldSize: worldSize, decisions: map[int64]*v1.Decision{},
		saved: map[int64]map[int32]bool{}, snapReports: map[string]map[string]v1.SnapshotOutcome{}, workers: map[string]int64{}}
	a.n.Runs++
}

func (a *acks) registered(runID, workerID string, incarnation int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.runs[runID].workers[workerID] = incarnation
	a.n.Registrations++
}

func (a *acks) decision(runID, writer string, d *v1.Decision) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastAck[writer] = time.Now()
	r := a.runs[runID]
	first, ok := r.decisions[d.Step]
	if !ok {
		r.decisions[d.Step] = proto.Clone(d).(*v1.Decision)
		a.n.Decisions++
		return
	}
	a.n.DecisionReads++
	if !proto.Equal(first, d) {
		a.violations = append(a.violations, fmt.Sprintf("run %s step %d: %s was told %v, an earlier rank %v", runID, d.Step, writer, d, first))
	}
}

func (a *acks) checkpointSaved(runID, writer string, step int64, rank int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastAck[writer] = time.Now()
	r := a.runs[runID]
	if r.saved[step] == nil {
		r.saved[step] = map[int32]bool{}
	}
	r.saved[step][rank] = true
	a.n.CheckpointReports++
}

func (a *acks) snapshotReported(runID, writer, snapshotID, workerID string, o v1.SnapshotOutcome) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastAck[writer] = time.Now()
	r := a.runs[runID]
	if r.snapReports[snapshotID] == nil {
		r.snapReports[snapshotID] = map[string]v1.SnapshotOutcome{}
	}
	r.snapReports[snapshotID][workerID] = o
	a.n.SnapshotReports++
}

// writer adds a writer that must make progress after every restart.
func (a *acks) writer(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastAck[name] = time.Time{}
}

// heard records that an environment worker received a command.
func (a *acks) heard(writer string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastAck[writer] = time.Now()
}

// copyRun is a consistent copy of one run's acknowledged writes.
func (a *acks) copyRun(id string) runAcks {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.runs[id]
	c := runAcks{id: r.id, worldSize: r.worldSize, decisions: map[int64]*v1.Decision{}, saved: map[int64]map[int32]bool{},
		snapReports: map[string]map[string]v1.SnapshotOutcome{}, workers: map[string]int64{}}
	for k, v := range r.decisions {
		c.decisions[k] = v
	}
	for k, v := range r.saved {
		c.saved[k] = map[int32]bool{}
		for rank := range v {
			c.saved[k][rank] = true
		}
	}
	for k, v := range r.snapReports {
		c.snapReports[k] = map[string]v1.SnapshotOutcome{}
		for w, o := range v {
			c.snapReports[k][w] = o
		}
	}
	for k, v := range r.workers {
		c.workers[k] = v
	}
	return c
}

func (a *acks) counts() counts {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

func (a *acks) takeViolations() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.violations
	a.violations = nil
	return v
}

// silentSince lists the writers with nothing acknowledged after t.
func (a *acks) silentSince(t time.Time) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for w, at := range a.lastAck {
		if !at.After(t) {
			out = append(out, w)
		}
	}
	return out
}

// anySnapshotReport returns the store key of one acknowledged snapshot
// report (run id, NUL, snapshot id, NUL, worker id), for --inject-loss.
func (a *acks) anySnapshotReport() ([]byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, r := range a.runs {
		for sid, reps := range r.snapReports {
			for wid := range reps {
				return []byte(id + "\x00" + sid + "\x00" + wid), true
			}
		}
	}
	return nil, false
}
