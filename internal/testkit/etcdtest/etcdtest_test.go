package etcdtest

import (
	"context"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The Go client (v3.7) against the Debian server (3.4): the calls the
// store and the election make.
func TestClientAgainstServer(t *testing.T) {
	c := Start(t, 3)
	ctx := ctxT(t)
	cli := Client(t, c)

	t.Run("txn", func(t *testing.T) {
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision("k"), "=", 0)).
			Then(clientv3.OpPut("k", "v1"), clientv3.OpPut("k2", "x")).
			Commit()
		if err != nil || !resp.Succeeded {
			t.Fatalf("txn on absent key: %v, succeeded %v", err, resp != nil && resp.Succeeded)
		}
		resp, err = cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision("k"), "=", 0)).
			Then(clientv3.OpPut("k", "v2")).
			Commit()
		if err != nil || resp.Succeeded {
			t.Fatalf("txn on present key: %v, succeeded %v; want refused", err, resp != nil && resp.Succeeded)
		}
		get, err := cli.Get(ctx, "k")
		if err != nil || len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "v1" {
			t.Fatalf("get k = %v, %v; want v1", get, err)
		}
	})

	t.Run("lease", func(t *testing.T) {
		lease, err := cli.Grant(ctx, 5)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, "leased", "x", clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Revoke(ctx, lease.ID); err != nil {
			t.Fatal(err)
		}
		get, err := cli.Get(ctx, "leased")
		if err != nil || len(get.Kvs) != 0 {
			t.Fatalf("leased key after revoke: %v, %v; want gone", get, err)
		}
	})

	t.Run("watch", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wch := cli.Watch(wctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(1))
		if _, err := cli.Put(ctx, "w/a", "1"); err != nil {
			t.Fatal(err)
		}
		select {
		case wr := <-wch:
			if err := wr.Err(); err != nil || len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != "w/a" {
				t.Fatalf("watch response %+v, %v; want the put of w/a", wr.Events, err)
			}
		case <-ctx.Done():
			t.Fatal("no watch event")
		}
	})

	t.Run("election", func(t *testing.T) {
		s1, err := concurrency.NewSession(cli, concurrency.WithTTL(2))
		if err != nil {
			t.Fatal(err)
		}
		defer s1.Close()
		s2, err := concurrency.NewSession(cli, concurrency.WithTTL(2))
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		e1, e2 := concurrency.NewElection(s1, "/elect"), concurrency.NewElection(s2, "/elect")
		if err := e1.Campaign(ctx, "one"); err != nil {
			t.Fatal(err)
		}
		won := make(chan error, 1)
		go func() { won <- e2.Campaign(ctx, "two") }()
		leader, err := e1.Leader(ctx)
		if err != nil || string(leader.Kvs[0].Value) != "one" {
			t.Fatalf("leader = %v, %v; want one", leader, err)
		}
		if err := e1.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-won; err != nil {
			t.Fatalf("second campaign: %v", err)
		}
		leader, err = e2.Leader(ctx)
		if err != nil || string(leader.Kvs[0].Value) != "two" {
			t.Fatalf("leader after resign = %v, %v; want two", leader, err)
		}
	})
}

// A 3-member cluster keeps committing with one member killed or paused,
// and a restarted member serves reads again with the data it missed.
func TestMemberFaults(t *testing.T) {
	c := Start(t, 3)
	ctx := ctxT(t)
	cli := Client(t, c)

	if err := c.Kill(0); err != nil {
		t.Fatal(err)
	}
	putEventually(t, ctx, cli, "after-kill")
	if err := c.Restart(ctx, 0); err != nil {
		t.Fatal(err)
	}
	only0, err := newClient(c.Endpoints()[:1], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer only0.Close()
	get, err := only0.Get(ctx, "after-kill")
	if err != nil || len(get.Kvs) != 1 {
		t.Fatalf("restarted member's read of a key written while it was dead: %v, %v", get, err)
	}

	if err := c.Stop(1); err != nil {
		t.Fatal(err)
	}
	putEventually(t, ctx, cli, "while-stopped")
	if err := c.Cont(1); err != nil {
		t.Fatal(err)
	}
	if err := c.await(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// putEventually puts key until a put succeeds: one that reached a
// member just killed or paused, the leader among them, times out while
// the others elect a new leader, and only then commits.
func putEventually(t *testing.T, ctx context.Context, cli *clientv3.Client, key string) {
	t.Helper()
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := cli.Put(attempt, key, "1")
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("put %s with one member of three down: %v", key, err)
		}
		t.Logf("put %s: %v; again", key, err)
		select { // back off: an error may come at once
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// With two of three members gone there is no quorum: a write does not
// commit (the context's deadline ends it).
func TestNoQuorumNoCommit(t *testing.T) {
	c := Start(t, 3)
	ctx := ctxT(t)
	cli := Client(t, c)
	for _, i := range []int{1, 2} {
		if err := c.Kill(i); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := cli.Put(short, "k", "v"); err == nil {
		t.Fatal("put committed without a quorum")
	}
}

func TestSharedIsOneCluster(t *testing.T) {
	a, b := Shared(t, 1), Shared(t, 1)
	if a != b {
		t.Fatal("Shared started a second cluster")
	}
	cli := Client(t, a)
	if _, err := cli.Put(ctxT(t), "shared", "1"); err != nil {
		t.Fatal(err)
	}
}

func TestMain(m *testing.M) {
	os.Exit(M{M: m}.Run())
}
