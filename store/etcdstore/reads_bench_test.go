package etcdstore_test

// Reads of many records, on bbolt and on a real 3-member etcd cluster:
//
//	go test -run '^$' -bench 'Snapshots|Events' ./store/etcdstore
//
// The same records on both backends, so the bbolt figures are the floor
// the etcd ones are measured against, and guard bbolt's speed: both go
// through the shared store.Reader.

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	snapcoordv1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/store"
	"github.com/snapcoord/snapcoord/store/etcdstore"
)

const (
	// benchSnapshots is about what the HA crash test's runs reach.
	benchSnapshots = 3000
	// benchReporters is the workers reporting on each snapshot.
	benchReporters = 8
	// benchEvents are read in pages of benchEventPage, as the engine
	// streams a run's events older than those it holds.
	benchEvents    = 10_000
	benchEventPage = 256
)

// readBackends opens an empty store of each backend for a read benchmark.
var readBackends = []struct {
	name string
	open func(b *testing.B) store.Store
}{
	{"bbolt", func(b *testing.B) store.Store {
		db, err := store.Open(filepath.Join(b.TempDir(), "snapcoord.db"), store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = db.Close() })
		return db
	}},
	{"etcd", func(b *testing.B) store.Store {
		cli := sharedClient(b)
		prefix := fmt.Sprintf("/bench/%s/%d", b.Name(), time.Now().UnixNano())
		return open(b, cli, prefix, benchFence(b, cli, prefix), etcdstore.Options{})
	}},
}

// commitAll submits the batches at once and waits for them all.
func commitAll(b *testing.B, s store.Store, batches []*store.Batch) {
	pending := make([]*store.Pending, len(batches))
	for i, batch := range batches {
		pending[i] = s.Submit(batch)
	}
	for _, p := range pending {
		if err := p.Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// snapshotBatches stores benchSnapshots completed snapshots of run
// "bench", each with benchReporters reports, in batches that fit one etcd
// txn; it returns their ids in the order the engine lists them.
func snapshotBatches() ([]*store.Batch, []string) {
	const perBatch = 12 // (1 + benchReporters) puts each, under 128 per txn
	var batches []*store.Batch
	ids := make([]string, benchSnapshots)
	now := timestamppb.Now()
	for i := range ids {
		if i%perBatch == 0 {
			batches = append(batches, &store.Batch{})
		}
		batch := batches[len(batches)-1]
		ids[i] = fmt.Sprintf("snap-%d", i+1)
		s := &snapcoordv1.Snapshot{SnapshotId: ids[i], AnchorStep: int64(i), CompletedAt: now}
		for w := range benchReporters {
			wid := fmt.Sprintf("w%d", w)
			s.ExpectedWorkerIds = append(s.ExpectedWorkerIds, wid)
			batch.PutSnapshotReport("bench", ids[i], &snapcoordv1.SnapshotReport{
				WorkerId: wid, Outcome: snapcoordv1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, DurationSeconds: 1.5, Message: "saved", ReportedAt: now,
			})
		}
		batch.PutSnapshot("bench", s)
	}
	return append([]*store.Batch{runBatch("bench")}, batches...), ids
}

// BenchmarkSnapshots reads all of a run's 3,000 snapshots with their
// reports, as ListSnapshots' pages together do.
func BenchmarkSnapshots(b *testing.B) {
	batches, ids := snapshotBatches()
	for _, bk := range readBackends {
		b.Run(bk.name, func(b *testing.B) {
			s := bk.open(b)
			commitAll(b, s, batches)
			for b.Loop() {
				n := 0
				err := s.Snapshots(context.Background(), "bench", ids, func(s *snapcoordv1.Snapshot) bool {
					n += len(s.Reports)
					return true
				})
				if err != nil || n != benchSnapshots*benchReporters {
					b.Fatalf("read %d reports: %v", n, err)
				}
			}
		})
	}
}

// BenchmarkEvents reads a run's 10,000 events in pages of 256.
func BenchmarkEvents(b *testing.B) {
	batches := []*store.Batch{runBatch("bench")}
	for seq := int64(1); seq <= benchEvents; seq++ {
		if seq%100 == 1 {
			batches = append(batches, &store.Batch{})
		}
		batches[len(batches)-1].PutEvent("bench", &snapcoordv1.RunEvent{
			Seq: seq, Type: snapcoordv1.RunEventType_RUN_EVENT_TYPE_DECISION, Message: "step decided: continue",
		})
	}
	for _, bk := range readBackends {
		b.Run(bk.name, func(b *testing.B) {
			s := bk.open(b)
			commitAll(b, s, batches)
			for b.Loop() {
				for after := int64(0); after < benchEvents; {
					evs, err := s.Events("bench", after, benchEvents, benchEventPage)
					if err != nil || len(evs) == 0 {
						b.Fatalf("events after %d: %d, %v", after, len(evs), err)
					}
					after = evs[len(evs)-1].Seq
				}
			}
		})
	}
}
