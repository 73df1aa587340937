package etcdstore_test

// Durable writes on a real 3-member etcd cluster on loopback:
//
//	go test -run '^$' -bench . ./store/etcdstore
//
// BenchmarkSubmit* go through the store (group commit, fenced txns);
// BenchmarkRawTxn* send a fenced txn of the same two puts per write
// straight to etcd: the floor the store's figures stand on.

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	snapcoordv1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/store"
	"github.com/snapcoord/snapcoord/store/etcdstore"
)

// benchWriters is the writers per GOMAXPROCS in the parallel benchmarks,
// as in the bbolt store's BenchmarkSubmit.
const benchWriters = 64

// benchStore opens a store with one run, fenced on a key of its own, and
// counts its commits.
func benchStore(b *testing.B) (*etcdstore.Store, *atomic.Int64) {
	cli := sharedClient(b)
	prefix := fmt.Sprintf("/bench/%s/%d", b.Name(), time.Now().UnixNano())
	fence := benchFence(b, cli, prefix)
	commits := new(atomic.Int64)
	s := open(b, cli, prefix, fence, etcdstore.Options{OnCommit: func(int, time.Duration) { commits.Add(1) }})
	commit(b, s, runBatch("bench"))
	commits.Store(0)
	return s, commits
}

func benchFence(b *testing.B, cli *clientv3.Client, prefix string) etcdstore.Fence {
	put, err := cli.Put(context.Background(), prefix+"/leader", "bench")
	if err != nil {
		b.Fatal(err)
	}
	return etcdstore.Fence{Key: prefix + "/leader", Revision: put.Header.Revision}
}

// benchBatch is a typical report: a worker update and an event.
func benchBatch(seq int64) *store.Batch {
	b := &store.Batch{}
	b.PutWorker("bench", &snapcoordv1.Worker{WorkerId: "w", Rank: 3, Incarnation: seq})
	b.PutEvent("bench", &snapcoordv1.RunEvent{Seq: seq, Message: "worker reported"})
	return b
}

func reportRate(b *testing.B, commits *atomic.Int64) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
	if commits != nil && commits.Load() > 0 {
		b.ReportMetric(float64(b.N)/float64(commits.Load()), "batches/commit")
	}
}

// BenchmarkSubmit: many concurrent writers, each waiting for its batch to
// be durable, as RPC handlers do; they share transactions.
func BenchmarkSubmit(b *testing.B) {
	s, commits := benchStore(b)
	var seq atomic.Int64
	b.SetParallelism(benchWriters)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := s.Submit(benchBatch(seq.Add(1))).Wait(context.Background()); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportRate(b, commits)
}

// BenchmarkSubmitSerial: one writer; every batch is a transaction.
func BenchmarkSubmitSerial(b *testing.B) {
	s, commits := benchStore(b)
	b.ResetTimer()
	for i := range b.N {
		if err := s.Submit(benchBatch(int64(i + 1))).Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, commits)
}

// rawTxn sends what one benchBatch is, alone: two puts of the same sizes,
// fenced the same way.
func rawTxn(cli *clientv3.Client, fence etcdstore.Fence, prefix string, seq int64) error {
	return rawCommit(cli, fence, rawOps(nil, prefix, seq))
}

// rawOps appends benchBatch(seq)'s puts under keys of the same length.
func rawOps(ops []clientv3.Op, prefix string, seq int64) []clientv3.Op {
	for i, o := range benchBatch(seq).Ops() {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s/raw/%d/%d", prefix, i, seq), string(o.Val)))
	}
	return ops
}

func rawCommit(cli *clientv3.Client, fence etcdstore.Fence, ops []clientv3.Op) error {
	resp, err := cli.Txn(context.Background()).
		If(clientv3.Compare(clientv3.CreateRevision(fence.Key), "=", fence.Revision)).
		Then(ops...).Commit()
	if err == nil && !resp.Succeeded {
		err = store.ErrFenced
	}
	return err
}

// BenchmarkRawTxn: the writers of BenchmarkSubmit, each sending its own
// txn to etcd.
func BenchmarkRawTxn(b *testing.B) {
	cli := sharedClient(b)
	prefix := fmt.Sprintf("/bench/%s/%d", b.Name(), time.Now().UnixNano())
	fence := benchFence(b, cli, prefix)
	var seq atomic.Int64
	b.SetParallelism(benchWriters)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := rawTxn(cli, fence, prefix, seq.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportRate(b, nil)
}

// BenchmarkRawTxnSerial: one writer's txns, one after another.
func BenchmarkRawTxnSerial(b *testing.B) {
	cli := sharedClient(b)
	prefix := fmt.Sprintf("/bench/%s/%d", b.Name(), time.Now().UnixNano())
	fence := benchFence(b, cli, prefix)
	b.ResetTimer()
	for i := range b.N {
		if err := rawTxn(cli, fence, prefix, int64(i+1)); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, nil)
}

// rawGroup is how many benchBatches fill one etcd txn (128 operations).
const rawGroup = 64

// BenchmarkRawTxnGroup: one writer sending full txns of rawGroup
// benchBatches' puts, one after another: what group commit at best
// achieves, counted in batches.
func BenchmarkRawTxnGroup(b *testing.B) {
	cli := sharedClient(b)
	prefix := fmt.Sprintf("/bench/%s/%d", b.Name(), time.Now().UnixNano())
	fence := benchFence(b, cli, prefix)
	b.ResetTimer()
	for i := 0; i < b.N; i += rawGroup {
		ops := make([]clientv3.Op, 0, 2*rawGroup)
		for j := range rawGroup {
			ops = rawOps(ops, prefix, int64(i+j+1))
		}
		if err := rawCommit(cli, fence, ops); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, nil)
}
