package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	snapcoordv1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// RunData is what Load reads of one run: everything but its older steps
// and events.
type RunData struct {
	Record *storagev1.RunRecord
	// Steps are the run's latest steps, by step: those numbered above
	// last_step - Window.Steps, and the step its deadline fired at. Step
	// reads an older one.
	Steps     []*storagev1.StepRecord
	Workers   []*snapcoordv1.Worker   // by worker id
	Snapshots []*snapcoordv1.Snapshot // by snapshot id; in flight: with their reports in the order reported; completed: summaries (see loadReports)
	// Events are the run's latest events, by seq: those above
	// last_event_seq - Window.Events. Events reads older ones.
	Events   []*snapcoordv1.RunEvent
	Commands []*snapcoordv1.Command // by seq
}

// Window says how many of each run's latest steps and events Load reads.
// A long run's older ones, hundreds of thousands, would otherwise all be
// held in memory.
type Window struct{ Steps, Events int64 }

// Everything makes Load read every step and event of every run.
var Everything = Window{Steps: math.MaxInt64, Events: math.MaxInt64}

// Load reads every run, sorted by run id, in one read transaction, with
// its steps and events in the window (see RunData). A record that does not
// unmarshal, or belongs to no stored run, is an error: skipping it would
// silently drop state.
func (db *DB) Load(ctx context.Context, w Window) ([]*RunData, error) {
	var runs []*RunData
	err := db.bolt.View(func(tx *bolt.Tx) error {
		var err error
		runs, err = loadTx(ctx, tx, w)
		return err
	})
	if err != nil {
		return nil, err
	}
	return runs, nil
}

func loadTx(ctx context.Context, tx *bolt.Tx, w Window) ([]*RunData, error) {
	runs, byID, err := loadRuns(tx)
	if err != nil {
		return nil, err
	}
	children := []func() error{
		func() error {
			return loadChildren(tx, bucketSteps, byID, bySeq(bucketSteps, func(rd *RunData, step int64) bool {
				run := rd.Record.GetRun()
				return step > run.GetLastStep()-w.Steps || step == run.GetFiredAtStep()
			}), func(rd *RunData, m *storagev1.StepRecord) { rd.Steps = append(rd.Steps, m) })
		},
		func() error {
			return loadChildren(tx, bucketWorkers, byID, nil, func(rd *RunData, m *snapcoordv1.Worker) { rd.Workers = append(rd.Workers, m) })
		},
		func() error {
			return loadChildren(tx, bucketSnapshots, byID, nil, func(rd *RunData, m *snapcoordv1.Snapshot) { rd.Snapshots = append(rd.Snapshots, m) })
		},
		func() error {
			return loadChildren(tx, bucketEvents, byID, bySeq(bucketEvents, func(rd *RunData, seq int64) bool {
				return seq > rd.Record.GetRun().GetLastEventSeq()-w.Events
			}), func(rd *RunData, m *snapcoordv1.RunEvent) { rd.Events = append(rd.Events, m) })
		},
		func() error {
			return loadChildren(tx, bucketCommands, byID, nil, func(rd *RunData, m *snapcoordv1.Command) { rd.Commands = append(rd.Commands, m) })
		},
	}
	for _, load := range children {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := load(); err != nil {
			return nil, err
		}
	}
	if err := loadReports(tx, byID); err != nil {
		return nil, err
	}
	return runs, nil
}

// bySeq is a keep for loadChildren of a bucket keyed by sequence number.
func bySeq(bucket []byte, keep func(rd *RunData, n int64) bool) func(*RunData, []byte) (bool, error) {
	return func(rd *RunData, k []byte) (bool, error) {
		n, err := seqOf(bucket, k)
		return err == nil && keep(rd, n), err
	}
}

// seqOf is the sequence number of a seqKey.
func seqOf(bucket, k []byte) (int64, error) {
	n := k[bytes.IndexByte(k, keySep)+1:]
	if len(n) != 8 {
		return 0, fmt.Errorf("store: bucket %s key %q: not a sequence number", bucket, k)
	}
	return int64(binary.BigEndian.Uint64(n)), nil
}

// Events reads up to limit of the run's stored events after seq after and
// up to upTo, by seq.
func (db *DB) Events(runID string, after, upTo int64, limit int) ([]*snapcoordv1.RunEvent, error) {
	var evs []*snapcoordv1.RunEvent
	err := db.bolt.View(func(tx *bolt.Tx) error {
		prefix := runPrefix(runID)
		c := tx.Bucket(bucketEvents).Cursor()
		for k, v := c.Seek(seqKey(runID, after+1)); k != nil && bytes.HasPrefix(k, prefix) && len(evs) < limit; k, v = c.Next() {
			seq, err := seqOf(bucketEvents, k)
			if err != nil {
				return err
			}
			if seq > upTo {
				break
			}
			ev := &snapcoordv1.RunEvent{}
			if err := proto.Unmarshal(v, ev); err != nil {
				return fmt.Errorf("store: bucket %s key %q: %w", bucketEvents, k, err)
			}
			evs = append(evs, ev)
		}
		return nil
	})
	return evs, err
}

// Step reads one step of a run; nil if it is not stored.
func (db *DB) Step(runID string, step int64) (*storagev1.StepRecord, error) {
	var st *storagev1.StepRecord
	err := db.bolt.View(func(tx *bolt.Tx) error {
		k := seqKey(runID, step)
		v := tx.Bucket(bucketSteps).Get(k)
		if v == nil {
			return nil
		}
		st = &storagev1.StepRecord{}
		if err := proto.Unmarshal(v, st); err != nil {
			return fmt.Errorf("store: bucket %s key %q: %w", bucketSteps, k, err)
		}
		return nil
	})
	return st, err
}

// loadReports attaches each stored report to its snapshot if that snapshot
// is still in flight. A completed snapshot loads as a summary, without its
// expected workers and reports, which Snapshots reads when they are asked
// for: a long run's reports would otherwise all be held in memory (about
// 2 MB per snapshot of 10,000 workers). Every report must still belong to a
// stored snapshot. Keys are run id, keySep, snapshot id, keySep, worker id.
func loadReports(tx *bolt.Tx, byID map[string]*RunData) error {
	snaps := map[string]*snapcoordv1.Snapshot{}
	for id, rd := range byID {
		for _, s := range rd.Snapshots {
			if s.CompletedAt != nil {
				s.ExpectedWorkerIds = nil
			}
			snaps[id+"\x00"+s.SnapshotId] = s
		}
	}
	err := tx.Bucket(bucketReports).ForEach(func(k, v []byte) error {
		i := bytes.LastIndexByte(k, keySep)
		s := snaps[string(k[:max(i, 0)])]
		if i < 0 || s == nil {
			return fmt.Errorf("store: bucket %s key %q: report of unknown snapshot", bucketReports, k)
		}
		if s.CompletedAt != nil {
			return nil
		}
		rep, err := unmarshalReport(k, v)
		s.Reports = append(s.Reports, rep)
		return err
	})
	for _, s := range snaps {
		sortReports(s.Reports)
	}
	return err
}

func unmarshalReport(k, v []byte) (*snapcoordv1.SnapshotReport, error) {
	rep := &snapcoordv1.SnapshotReport{}
	if err := proto.Unmarshal(v, rep); err != nil {
		return nil, fmt.Errorf("store: bucket %s key %q: %w", bucketReports, k, err)
	}
	return rep, nil
}

// sortReports puts reports in the order they were reported; they are
// stored by worker id.
func sortReports(reps []*snapcoordv1.SnapshotReport) {
	slices.SortStableFunc(reps, func(a, b *snapcoordv1.SnapshotReport) int {
		return a.GetReportedAt().AsTime().Compare(b.GetReportedAt().AsTime())
	})
}

// Snapshots reads the run's snapshots with the given ids in full, with
// their reports in the order reported, and passes them to yield in the
// order given until it returns false. They come from one read transaction,
// so from one commit. A snapshot not stored is an error.
func (db *DB) Snapshots(ctx context.Context, runID string, ids []string, yield func(*snapcoordv1.Snapshot) bool) error {
	return db.bolt.View(func(tx *bolt.Tx) error {
		for _, id := range ids {
			if err := ctx.Err(); err != nil {
				return err
			}
			s, err := readSnapshot(tx, runID, id)
			if err != nil {
				return err
			}
			if !yield(s) {
				return nil
			}
		}
		return nil
	})
}

// SnapshotReport reads one worker's stored report on a snapshot; nil if
// there is none.
func (db *DB) SnapshotReport(runID, snapshotID, workerID string) (*snapcoordv1.SnapshotReport, error) {
	var rep *snapcoordv1.SnapshotReport
	err := db.bolt.View(func(tx *bolt.Tx) error {
		k := reportKey(runID, snapshotID, workerID)
		v := tx.Bucket(bucketReports).Get(k)
		if v == nil {
			return nil
		}
		var err error
		rep, err = unmarshalReport(k, v)
		return err
	})
	return rep, err
}

func readSnapshot(tx *bolt.Tx, runID, id string) (*snapcoordv1.Snapshot, error) {
	k := nameKey(runID, id)
	v := tx.Bucket(bucketSnapshots).Get(k)
	if v == nil {
		return nil, fmt.Errorf("store: run %q: snapshot %q is not stored", runID, id)
	}
	s := &snapcoordv1.Snapshot{}
	if err := proto.Unmarshal(v, s); err != nil {
		return nil, fmt.Errorf("store: bucket %s key %q: %w", bucketSnapshots, k, err)
	}
	prefix := reportKey(runID, id, "")
	c := tx.Bucket(bucketReports).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		rep, err := unmarshalReport(k, v)
		if err != nil {
			return nil, err
		}
		s.Reports = append(s.Reports, rep)
	}
	sortReports(s.Reports)
	return s, nil
}

// loadRuns reads the runs bucket; bbolt iterates in key order, which is
// run id order.
func loadRuns(tx *bolt.Tx) ([]*RunData, map[string]*RunData, error) {
	var runs []*RunData
	byID := make(map[string]*RunData)
	err := tx.Bucket(bucketRuns).ForEach(func(k, v []byte) error {
		rec := &storagev1.RunRecord{}
		if err := proto.Unmarshal(v, rec); err != nil {
			return fmt.Errorf("store: bucket %s key %q: %w", bucketRuns, k, err)
		}
		rd := &RunData{Record: rec}
		runs = append(runs, rd)
		byID[string(k)] = rd
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return runs, byID, nil
}

// loadChildren reads a per-run bucket, the records keep accepts (all if
// keep is nil). Keys are run id, keySep, then a big-endian number or a
// name, so bbolt's order is the order RunData promises. Every key is
// checked against its run; only the records kept are unmarshalled.
func loadChildren[M any, PM interface {
	*M
	proto.Message
}](tx *bolt.Tx, bucket []byte, byID map[string]*RunData, keep func(*RunData, []byte) (bool, error), add func(*RunData, PM)) error {
	return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
		i := bytes.IndexByte(k, keySep)
		if i < 0 {
			return fmt.Errorf("store: bucket %s key %q: no run id separator", bucket, k)
		}
		rd := byID[string(k[:i])]
		if rd == nil {
			return fmt.Errorf("store: bucket %s key %q: record of unknown run %q", bucket, k, k[:i])
		}
		if keep != nil {
			if ok, err := keep(rd, k); !ok {
				return err
			}
		}
		m := PM(new(M))
		if err := proto.Unmarshal(v, m); err != nil {
			return fmt.Errorf("store: bucket %s key %q: %w", bucket, k, err)
		}
		add(rd, m)
		return nil
	})
}

// Check runs bbolt's consistency check and returns its first finding.
func (db *DB) Check() error {
	// Commits are held off: the check reads bbolt's freelist, which a
	// concurrent commit would change under it.
	db.commitMu.Lock()
	defer db.commitMu.Unlock()
	return db.bolt.View(func(tx *bolt.Tx) error {
		var first error
		for err := range tx.Check() {
			if first == nil {
				first = err
			}
			// Keep draining: the checker goroutine blocks until we do.
		}
		if first != nil {
			return fmt.Errorf("store: %s: consistency check: %w", db.path, first)
		}
		return nil
	})
}
