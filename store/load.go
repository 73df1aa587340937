package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

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

// KV is one consistent read view of the store's buckets: a bbolt read
// transaction, or one etcd revision. A value is valid only until the
// View's function returns.
type KV interface {
	// Get returns key's value in bucket b; nil if it is not stored.
	Get(ctx context.Context, b Bucket, key []byte) ([]byte, error)
	// Scan calls fn with the keys of bucket b that start with prefix and
	// are not below from, in byte order, until fn returns false or an error.
	// want, if above 0, says fn takes no more than want keys, so that a
	// backend reading in pages reads no more.
	Scan(ctx context.Context, b Bucket, prefix, from []byte, want int, fn func(k, v []byte) (bool, error)) error
	// GetAll returns the values of keys in bucket b, in the order of keys;
	// nil for a key not stored. Where every read is a round trip, as on
	// etcd, the backend reads them together.
	GetAll(ctx context.Context, b Bucket, keys [][]byte) ([][]byte, error)
	// ScanAll calls fn(i, k, v) for every key k of bucket b that starts
	// with prefixes[i]: prefix after prefix in the order given, each
	// prefix's keys in byte order. Like GetAll, it reads them together.
	ScanAll(ctx context.Context, b Bucket, prefixes [][]byte, fn func(i int, k, v []byte) error) error
}

// Viewer opens read views; every backend is one.
type Viewer interface {
	// View runs fn over one consistent view of the store.
	View(ctx context.Context, fn func(KV) error) error
}

// Reader is the reads of a Store (Load, Events, Step, Snapshots,
// SnapshotReport) over a backend's Viewer, so that every backend decodes
// the same records the same way.
type Reader struct{ Viewer Viewer }

// each calls fn for every record of bucket b whose key starts with prefix.
func each(ctx context.Context, kv KV, b Bucket, prefix []byte, fn func(k, v []byte) error) error {
	return kv.Scan(ctx, b, prefix, nil, 0, func(k, v []byte) (bool, error) { return true, fn(k, v) })
}

// Load reads every run, sorted by run id, from one view, with its steps
// and events in the window (see RunData). A record that does not
// unmarshal, or belongs to no stored run, is an error: skipping it would
// silently drop state.
func (r Reader) Load(ctx context.Context, w Window) ([]*RunData, error) {
	var runs []*RunData
	err := r.Viewer.View(ctx, func(kv KV) error {
		var err error
		runs, err = loadView(ctx, kv, w)
		return err
	})
	if err != nil {
		return nil, err
	}
	return runs, nil
}

func loadView(ctx context.Context, tx KV, w Window) ([]*RunData, error) {
	runs, byID, err := loadRuns(ctx, tx)
	if err != nil {
		return nil, err
	}
	children := []func() error{
		func() error {
			return loadChildren(ctx, tx, idSteps, byID, bySeq(idSteps, func(rd *RunData, step int64) bool {
				run := rd.Record.GetRun()
				return step > run.GetLastStep()-w.Steps || step == run.GetFiredAtStep()
			}), func(rd *RunData, m *storagev1.StepRecord) { rd.Steps = append(rd.Steps, m) })
		},
		func() error {
			return loadChildren(ctx, tx, idWorkers, byID, nil, func(rd *RunData, m *snapcoordv1.Worker) { rd.Workers = append(rd.Workers, m) })
		},
		func() error {
			return loadChildren(ctx, tx, idSnapshots, byID, nil, func(rd *RunData, m *snapcoordv1.Snapshot) { rd.Snapshots = append(rd.Snapshots, m) })
		},
		func() error {
			return loadChildren(ctx, tx, idEvents, byID, bySeq(idEvents, func(rd *RunData, seq int64) bool {
				return seq > rd.Record.GetRun().GetLastEventSeq()-w.Events
			}), func(rd *RunData, m *snapcoordv1.RunEvent) { rd.Events = append(rd.Events, m) })
		},
		func() error {
			return loadChildren(ctx, tx, idCommands, byID, nil, func(rd *RunData, m *snapcoordv1.Command) { rd.Commands = append(rd.Commands, m) })
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
	if err := loadReports(ctx, tx, byID); err != nil {
		return nil, err
	}
	return runs, nil
}

// bySeq is a keep for loadChildren of a bucket keyed by sequence number.
func bySeq(bucket Bucket, keep func(rd *RunData, n int64) bool) func(*RunData, []byte) (bool, error) {
	return func(rd *RunData, k []byte) (bool, error) {
		n, err := seqOf(bucket, k)
		return err == nil && keep(rd, n), err
	}
}

// seqOf is the sequence number of a seqKey.
func seqOf(bucket Bucket, k []byte) (int64, error) {
	n := k[bytes.IndexByte(k, keySep)+1:]
	if len(n) != 8 {
		return 0, fmt.Errorf("store: bucket %s key %q: not a sequence number", bucket, k)
	}
	return int64(binary.BigEndian.Uint64(n)), nil
}

// Events reads up to limit of the run's stored events after seq after and
// up to upTo, by seq.
func (r Reader) Events(runID string, after, upTo int64, limit int) ([]*snapcoordv1.RunEvent, error) {
	var evs []*snapcoordv1.RunEvent
	ctx := context.Background()
	err := r.Viewer.View(ctx, func(kv KV) error {
		evs = nil // a view may run fn again
		if limit <= 0 {
			return nil
		}
		return kv.Scan(ctx, idEvents, runPrefix(runID), seqKey(runID, after+1), limit, func(k, v []byte) (bool, error) {
			seq, err := seqOf(idEvents, k)
			if err != nil || seq > upTo {
				return false, err
			}
			ev := &snapcoordv1.RunEvent{}
			if err := proto.Unmarshal(v, ev); err != nil {
				return false, fmt.Errorf("store: bucket %s key %q: %w", idEvents, k, err)
			}
			evs = append(evs, ev)
			return len(evs) < limit, nil
		})
	})
	return evs, err
}

// Step reads one step of a run; nil if it is not stored.
func (r Reader) Step(runID string, step int64) (*storagev1.StepRecord, error) {
	var st *storagev1.StepRecord
	ctx := context.Background()
	err := r.Viewer.View(ctx, func(kv KV) error {
		k := seqKey(runID, step)
		v, err := kv.Get(ctx, idSteps, k)
		if v == nil || err != nil {
			return err
		}
		st = &storagev1.StepRecord{}
		if err := proto.Unmarshal(v, st); err != nil {
			return fmt.Errorf("store: bucket %s key %q: %w", idSteps, k, err)
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
func loadReports(ctx context.Context, tx KV, byID map[string]*RunData) error {
	snaps := map[string]*snapcoordv1.Snapshot{}
	for id, rd := range byID {
		for _, s := range rd.Snapshots {
			if s.CompletedAt != nil {
				s.ExpectedWorkerIds = nil
			}
			snaps[id+"\x00"+s.SnapshotId] = s
		}
	}
	err := each(ctx, tx, idReports, nil, func(k, v []byte) error {
		i := bytes.LastIndexByte(k, keySep)
		s := snaps[string(k[:max(i, 0)])]
		if i < 0 || s == nil {
			return fmt.Errorf("store: bucket %s key %q: report of unknown snapshot", idReports, k)
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
		return nil, fmt.Errorf("store: bucket %s key %q: %w", idReports, k, err)
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
//
// They are read in chunks, each chunk's snapshots and reports together
// (on etcd a few requests, not two per snapshot). Chunks double in size
// from one, so a yield that stops early, as a page full in bytes does,
// leaves fewer snapshots read in vain than it took.
func (r Reader) Snapshots(ctx context.Context, runID string, ids []string, yield func(*snapcoordv1.Snapshot) bool) error {
	return r.Viewer.View(ctx, func(tx KV) error {
		rest := ids
		for n := 1; len(rest) > 0; n = min(2*n, maxSnapshotChunk) {
			if err := ctx.Err(); err != nil {
				return err
			}
			chunk := rest[:min(n, len(rest))]
			rest = rest[len(chunk):]
			snaps, err := readSnapshots(ctx, tx, runID, chunk)
			if err != nil {
				return err
			}
			for i, s := range snaps {
				if s == nil {
					return fmt.Errorf("store: run %q: snapshot %q is not stored", runID, chunk[i])
				}
				if !yield(s) {
					return nil
				}
			}
		}
		return nil
	})
}

// maxSnapshotChunk bounds what Snapshots holds at once beyond what it
// yielded.
const maxSnapshotChunk = 1024

// SnapshotReport reads one worker's stored report on a snapshot; nil if
// there is none.
func (r Reader) SnapshotReport(runID, snapshotID, workerID string) (*snapcoordv1.SnapshotReport, error) {
	var rep *snapcoordv1.SnapshotReport
	ctx := context.Background()
	err := r.Viewer.View(ctx, func(tx KV) error {
		k := reportKey(runID, snapshotID, workerID)
		v, err := tx.Get(ctx, idReports, k)
		if v == nil || err != nil {
			return err
		}
		rep, err = unmarshalReport(k, v)
		return err
	})
	return rep, err
}

// readSnapshots reads the snapshots with the given ids and their reports;
// nil for one not stored.
func readSnapshots(ctx context.Context, tx KV, runID string, ids []string) ([]*snapcoordv1.Snapshot, error) {
	keys := make([][]byte, len(ids))
	for i, id := range ids {
		keys[i] = nameKey(runID, id)
	}
	vals, err := tx.GetAll(ctx, idSnapshots, keys)
	if err != nil {
		return nil, err
	}
	snaps := make([]*snapcoordv1.Snapshot, len(ids))
	var stored []*snapcoordv1.Snapshot // those with reports to read
	var prefixes [][]byte
	for i, v := range vals {
		if v == nil {
			continue
		}
		snaps[i] = &snapcoordv1.Snapshot{}
		if err := proto.Unmarshal(v, snaps[i]); err != nil {
			return nil, fmt.Errorf("store: bucket %s key %q: %w", idSnapshots, keys[i], err)
		}
		stored = append(stored, snaps[i])
		prefixes = append(prefixes, reportKey(runID, ids[i], ""))
	}
	err = tx.ScanAll(ctx, idReports, prefixes, func(i int, k, v []byte) error {
		rep, err := unmarshalReport(k, v)
		stored[i].Reports = append(stored[i].Reports, rep)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, s := range stored {
		sortReports(s.Reports)
	}
	return snaps, nil
}

// loadRuns reads the runs bucket; a scan is in key order, which is run id
// order.
func loadRuns(ctx context.Context, tx KV) ([]*RunData, map[string]*RunData, error) {
	var runs []*RunData
	byID := make(map[string]*RunData)
	err := each(ctx, tx, idRuns, nil, func(k, v []byte) error {
		rec := &storagev1.RunRecord{}
		if err := proto.Unmarshal(v, rec); err != nil {
			return fmt.Errorf("store: bucket %s key %q: %w", idRuns, k, err)
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
// name, so byte order is the order RunData promises. Every key is
// checked against its run; only the records kept are unmarshalled.
func loadChildren[M any, PM interface {
	*M
	proto.Message
}](ctx context.Context, tx KV, bucket Bucket, byID map[string]*RunData, keep func(*RunData, []byte) (bool, error), add func(*RunData, PM)) error {
	return each(ctx, tx, bucket, nil, func(k, v []byte) error {
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
