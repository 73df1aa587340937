package store

import (
	"encoding/binary"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	snapcoordv1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// keySep ends the run id in every per-run key. It sorts below every other
// byte, so run "a"'s records never interleave with run "a.b"'s, and a run
// id may not contain it.
const keySep = 0x00

var marshalOpts = proto.MarshalOptions{Deterministic: true}

// OpKind is what an Op does.
type OpKind uint8

const (
	// OpPut stores Val under Key.
	OpPut OpKind = iota
	// OpPutIfAbsent stores Val under Key unless Key is already stored.
	OpPutIfAbsent
	// OpDelete deletes Key.
	OpDelete
	// OpDeleteThrough deletes every key that starts with Key (a run's
	// prefix) and is not above Val; every such key if Val is nil.
	OpDeleteThrough
)

// Op is one change of a Batch, as a backend applies it. Ops apply in
// order: a later one wins over an earlier one on the same key.
type Op struct {
	Kind   OpKind
	Bucket Bucket
	Key    []byte
	Val    []byte
}

// Batch collects changes that commit atomically. Puts marshal at once, so
// the caller may mutate its messages right after. A Batch is built by one
// goroutine and submitted once.
type Batch struct {
	ops []Op
	// err is the first invalid Put; the batch then fails at commit.
	err error
}

// PutRun stores a run record under its run id.
func (b *Batch) PutRun(r *storagev1.RunRecord) {
	id := r.GetRun().GetRunId()
	if b.checkRunID(id) {
		b.put(idRuns, []byte(id), r)
	}
}

// PutStep stores a step record of a run.
func (b *Batch) PutStep(runID string, s *storagev1.StepRecord) {
	b.putSeq(idSteps, runID, "step", s.GetStep(), s)
}

// PutWorker stores a worker of a run.
func (b *Batch) PutWorker(runID string, w *snapcoordv1.Worker) {
	if b.checkRunID(runID) {
		b.put(idWorkers, nameKey(runID, w.GetWorkerId()), w)
	}
}

// PutSnapshot stores a snapshot of a run, without its reports: those are
// stored one by one with PutSnapshotReport, so that N workers reporting cost
// N small writes rather than N rewrites of an ever larger record.
func (b *Batch) PutSnapshot(runID string, s *snapcoordv1.Snapshot) {
	if !b.checkRunID(runID) {
		return
	}
	reports := s.Reports
	s.Reports = nil // the caller holds s exclusively while it builds the batch
	b.put(idSnapshots, nameKey(runID, s.GetSnapshotId()), s)
	s.Reports = reports
}

// PutSnapshotReport stores one worker's report on a snapshot unless that
// worker's report is already stored: the first report stands, also when a
// retry races it. Load and Snapshots return it in the snapshot's Reports.
func (b *Batch) PutSnapshotReport(runID, snapshotID string, r *snapcoordv1.SnapshotReport) {
	if !b.checkRunID(runID) {
		return
	}
	if strings.IndexByte(snapshotID, keySep) >= 0 {
		b.fail(fmt.Errorf("store: snapshot id %q contains a NUL byte", snapshotID))
		return
	}
	b.add(OpPutIfAbsent, idReports, reportKey(runID, snapshotID, r.GetWorkerId()), r)
}

// PutEvent stores an event of a run.
func (b *Batch) PutEvent(runID string, e *snapcoordv1.RunEvent) {
	b.putSeq(idEvents, runID, "event seq", e.GetSeq(), e)
}

// PutCommand stores a command of a run.
func (b *Batch) PutCommand(runID string, c *snapcoordv1.Command) {
	b.putSeq(idCommands, runID, "command seq", c.GetSeq(), c)
}

// DeleteEventsThrough deletes the run's events with a sequence number up to
// and including seq. It applies in order with the batch's other changes.
func (b *Batch) DeleteEventsThrough(runID string, seq int64) {
	if seq < 0 || !b.checkRunID(runID) {
		return // sequence numbers are never negative, so nothing matches
	}
	b.ops = append(b.ops, Op{
		Kind:   OpDeleteThrough,
		Bucket: idEvents,
		Key:    runPrefix(runID),
		Val:    seqKey(runID, seq),
	})
}

// DeleteRun deletes the run's record and everything stored under it,
// atomically with the batch's other changes.
func (b *Batch) DeleteRun(runID string) {
	if !b.checkRunID(runID) {
		return
	}
	for _, bucket := range []Bucket{idSteps, idWorkers, idSnapshots, idReports, idEvents, idCommands} {
		b.ops = append(b.ops, Op{Kind: OpDeleteThrough, Bucket: bucket, Key: runPrefix(runID)})
	}
	b.ops = append(b.ops, Op{Kind: OpDelete, Bucket: idRuns, Key: []byte(runID)})
}

// Len returns the number of changes in the batch.
func (b *Batch) Len() int { return len(b.ops) }

// Ops returns the batch's changes in order, for a backend to apply; the
// caller must not modify them.
func (b *Batch) Ops() []Op { return b.ops }

// Err is the batch's first invalid change, which fails its commit.
func (b *Batch) Err() error { return b.err }

func (b *Batch) putSeq(bucket Bucket, runID, what string, n int64, m proto.Message) {
	if n < 0 {
		// A negative number would sort after every positive one.
		b.fail(fmt.Errorf("store: run %q: negative %s %d", runID, what, n))
		return
	}
	if b.checkRunID(runID) {
		b.put(bucket, seqKey(runID, n), m)
	}
}

func (b *Batch) put(bucket Bucket, key []byte, m proto.Message) {
	b.add(OpPut, bucket, key, m)
}

func (b *Batch) add(kind OpKind, bucket Bucket, key []byte, m proto.Message) {
	val, err := marshalOpts.Marshal(m)
	if err != nil {
		b.fail(fmt.Errorf("store: marshal %s %q: %w", bucket, key, err))
		return
	}
	b.ops = append(b.ops, Op{Kind: kind, Bucket: bucket, Key: key, Val: val})
}

// checkRunID rejects run ids that would break the key layout. An empty id
// is left for bbolt to reject (empty key), which it does loudly.
func (b *Batch) checkRunID(runID string) bool {
	if strings.IndexByte(runID, keySep) >= 0 {
		b.fail(fmt.Errorf("store: run id %q contains a NUL byte", runID))
		return false
	}
	return true
}

func (b *Batch) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

func runPrefix(runID string) []byte {
	k := make([]byte, 0, len(runID)+1)
	k = append(k, runID...)
	return append(k, keySep)
}

func nameKey(runID, name string) []byte {
	k := make([]byte, 0, len(runID)+1+len(name))
	k = append(k, runID...)
	k = append(k, keySep)
	return append(k, name...)
}

// reportKey is run id, keySep, snapshot id, keySep, worker id: a
// snapshot's reports are one key range.
func reportKey(runID, snapshotID, workerID string) []byte {
	return nameKey(runID, snapshotID+"\x00"+workerID)
}

func seqKey(runID string, n int64) []byte {
	k := make([]byte, 0, len(runID)+1+8)
	k = append(k, runID...)
	k = append(k, keySep)
	return binary.BigEndian.AppendUint64(k, uint64(n))
}
