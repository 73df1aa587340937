package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
)

// etcdMembers is the cluster the etcd figures run on: the smallest that
// survives the loss of a member, as docs/ha.md deploys it.
const etcdMembers = 3

// etcd: the coordinator with --store etcd on a 3-member cluster on
// loopback (Debian's etcd, internal/testkit/etcdtest), each figure against raw etcd
// transactions of the same size from as many writers on the same cluster:
// durable decisions (CompleteStep, 8 runs × 8 ranks: one new decision per
// run and step) and durable reports at each --report-workers.
func (b *bench) etcd(ctx context.Context) error {
	cluster, err := etcdtest.Launch(ctx, filepath.Join(b.tmp, "etcd"), etcdMembers)
	if err != nil {
		return err
	}
	defer cluster.Close()
	cli, err := cluster.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	flags := func(name string) []string { return etcdServeFlags(cluster, name) }
	w := b.window()
	fence, err := floorFence(ctx, cli)
	if err != nil {
		return err
	}

	res, _, d, err := b.stepLoop(ctx, "etcd-steps", flags("steps")...)
	if err != nil {
		return err
	}
	size := decisionSize(d)
	floor, err := etcdFloor(ctx, cli, fence, "/floor/steps/", b.cfg.stepRuns, size, w)
	if err != nil {
		return err
	}
	decisions := res.rate() / float64(b.cfg.stepRanks)
	b.add(row{
		ID: "etcd_decisions", Figure: fmt.Sprintf("etcd: durable decisions, CompleteStep from %d ranks (%d runs × %d)", b.cfg.stepRuns*b.cfg.stepRanks, b.cfg.stepRuns, b.cfg.stepRanks),
		Value: decisions, Unit: "/s", Lat: latOf(summarize(res.lats)),
		Floor: floor.rate(), FloorWhat: fmt.Sprintf("etcd Txn, %d writers", b.cfg.stepRuns), FloorLat: latOf(summarize(floor.lats)),
		Note: fmt.Sprintf("%.0f CompleteStep calls/s, latency of every call (one rank of each run waits for the decision's commit, the others for that rank); %d-byte values (a step record with its decision, and the decision event)",
			res.rate(), size),
	})

	for _, n := range b.cfg.reportWorkers {
		name := fmt.Sprintf("etcd-reports-%d", n)
		res, err := b.reportLoop(ctx, name, n, false, flags(name)...)
		if err != nil {
			return err
		}
		size := stepRecordSize(n)
		floor, err := etcdFloor(ctx, cli, fence, "/floor/"+name+"/", n, size, w)
		if err != nil {
			return err
		}
		b.add(row{
			ID: fmt.Sprintf("etcd_reports_%d", n), Figure: fmt.Sprintf("etcd: durable reports, %d workers", n),
			Value: res.rate(), Unit: "/s", Lat: latOf(summarize(res.lats)),
			Floor: floor.rate(), FloorWhat: fmt.Sprintf("etcd Txn, %d writers", n), FloorLat: latOf(summarize(floor.lats)),
			Note: fmt.Sprintf("%d-byte values", size),
		})
	}
	return nil
}

// etcdServeFlags has a coordinator store on the cluster, under a prefix of
// its own.
func etcdServeFlags(cluster *etcdtest.Cluster, name string) []string {
	return []string{"--store", "etcd", "--etcd-endpoints", strings.Join(cluster.Endpoints(), ","), "--etcd-prefix", "/snapbench/" + name}
}

// decisionSize is what a decision writes (keys included): the step record
// holding it, and the decision event.
func decisionSize(d *v1.Decision) int {
	rec := &storagev1.StepRecord{Step: d.GetStep(), Decision: d, MaxIterationSeconds: 10}
	ev := &v1.RunEvent{Seq: 100000, At: timestamppb.Now(), Type: v1.RunEventType_RUN_EVENT_TYPE_DECISION, Step: d.GetStep(), Decision: d}
	return proto.Size(rec) + proto.Size(ev) + 2*(len("/snapbench/steps/")+len("steps-0")+8)
}

// floorFence stands for a leader's election key: the floor's transactions
// are conditioned on it as the coordinator's commits are on theirs.
func floorFence(ctx context.Context, cli *clientv3.Client) (clientv3.Cmp, error) {
	const key = "/floor/leader"
	resp, err := cli.Put(ctx, key, "floor")
	if err != nil {
		return clientv3.Cmp{}, err
	}
	return clientv3.Compare(clientv3.CreateRevision(key), "=", resp.Header.Revision), nil
}

// etcdFloor has writers goroutines each commit one etcd transaction of a
// put of size bytes under a new key, fenced like the coordinator's, back to
// back, for the window: what a durable write costs on the cluster without
// the coordinator. Concurrent transactions share raft proposals and fsyncs
// inside etcd; the coordinator's group commit goes further and puts every
// waiting write in one transaction.
func etcdFloor(ctx context.Context, cli *clientv3.Client, fence clientv3.Cmp, prefix string, writers, size int, w window) (loopResult, error) {
	val := string(make([]byte, size))
	return closedLoop(ctx, writers, w, nil, func(ctx context.Context, i int, k int64) error {
		var key [12]byte
		binary.BigEndian.PutUint32(key[:4], uint32(i))
		binary.BigEndian.PutUint64(key[4:], uint64(k))
		resp, err := cli.Txn(ctx).If(fence).Then(clientv3.OpPut(prefix+string(key[:]), val)).Commit()
		if err == nil && !resp.Succeeded {
			err = errors.New("the floor's fence was refused")
		}
		return err
	})
}
