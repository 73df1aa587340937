package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	berrors "go.etcd.io/bbolt/errors"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
	"github.com/snapcoord/snapcoord/store"
	"github.com/snapcoord/snapcoord/store/etcdstore"
)

// backend is one store implementation under the shared suite.
type backend struct {
	name string
	// open opens a new, empty store, closed when t ends.
	open func(t testing.TB, opts store.Options) store.Store
	// reopen closes st and opens what it stored again.
	reopen func(t testing.TB, st store.Store) store.Store
	// putRaw stores val under key in bucket b behind the store's back.
	putRaw func(t testing.TB, st store.Store, b store.Bucket, key, val []byte)
	// check checks the store's own consistency, where it has a check.
	check func(st store.Store) error
	// failing is a batch whose commit the backend refuses, and the error
	// the failure wraps.
	failing func() (*store.Batch, error)
}

var backends = []*backend{bboltBackend, etcdBackend}

// suite runs on every backend: TestBackends/<backend>/<test>.
var suite = map[string]func(*testing.T, *backend){
	"RoundTrip":                     testRoundTrip,
	"LoadEmpty":                     testLoadEmpty,
	"PutOverwrites":                 testPutOverwrites,
	"DeleteEventsThrough":           testDeleteEventsThrough,
	"DeleteAfterPutInSameBatch":     testDeleteAfterPutInSameBatch,
	"PutSnapshotsMessage":           testPutSnapshotsMessage,
	"GroupCommit":                   testGroupCommit,
	"DoneInSubmitOrder":             testDoneInSubmitOrder,
	"CommitFailurePoisons":          testCommitFailurePoisons,
	"InvalidBatchFails":             testInvalidBatchFails,
	"CloseDrains":                   testCloseDrains,
	"CloseRacesSubmit":              testCloseRacesSubmit,
	"LoadCorruptRecord":             testLoadCorruptRecord,
	"LoadOrphanRecord":              testLoadOrphanRecord,
	"SnapshotReportsRoundTrip":      testSnapshotReportsRoundTrip,
	"CompletedSnapshotReadOnDemand": testCompletedSnapshotReadOnDemand,
	"DeleteRun":                     testDeleteRun,
	"LoadWindow":                    testLoadWindow,
}

func TestBackends(t *testing.T) {
	names := make([]string, 0, len(suite))
	for name := range suite {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			for _, name := range names {
				t.Run(name, func(t *testing.T) { suite[name](t, bk) })
			}
		})
	}
}

var bboltBackend = &backend{
	name: "bbolt",
	open: func(t testing.TB, opts store.Options) store.Store { return mustOpen(t, tempPath(t), opts) },
	reopen: func(t testing.TB, st store.Store) store.Store {
		return reopen(t, st.(*store.DB))
	},
	putRaw: func(t testing.TB, st store.Store, b store.Bucket, key, val []byte) {
		t.Helper()
		if err := st.(*store.DB).PutRaw(b, key, val); err != nil {
			t.Fatal(err)
		}
	},
	check: func(st store.Store) error { return st.(*store.DB).Check() },
	failing: func() (*store.Batch, error) {
		b := &store.Batch{}
		b.PutRun(runRecord("")) // bbolt refuses an empty key
		return b, berrors.ErrKeyRequired
	},
}

// etcdClusterSize is the shared cluster's: 3 members, as in production.
const etcdClusterSize = 3

// etcdPageSize makes every Load read its ranges in several pages.
const etcdPageSize = 3

var etcdStores atomic.Int64

var etcdBackend = &backend{
	name: "etcd",
	open: func(t testing.TB, opts store.Options) store.Store {
		t.Helper()
		cli := etcdClient(t)
		prefix := fmt.Sprintf("/test/%s/%d", t.Name(), etcdStores.Add(1))
		put, err := cli.Put(t.Context(), prefix+"/leader", "me")
		if err != nil {
			t.Fatal(err)
		}
		fence := etcdstore.Fence{Key: prefix + "/leader", Revision: put.Header.Revision}
		return openEtcd(t, cli, prefix, fence, opts)
	},
	reopen: func(t testing.TB, st store.Store) store.Store {
		t.Helper()
		s := st.(*etcdstore.Store)
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		return openEtcd(t, s.Client(), s.Prefix(), s.Fence(), store.Options{})
	},
	putRaw: func(t testing.TB, st store.Store, b store.Bucket, key, val []byte) {
		t.Helper()
		s := st.(*etcdstore.Store)
		if _, err := s.Client().Put(t.Context(), s.Key(b, key), string(val)); err != nil {
			t.Fatal(err)
		}
	},
	check: func(store.Store) error { return nil },
	failing: func() (*store.Batch, error) {
		b := &store.Batch{}
		b.PutRun(runRecord("big"))
		for i := range 200 { // more than etcd's 128 operations per txn
			b.PutEvent("big", event(int64(i+1), "x"))
		}
		return b, etcdstore.ErrBatchTooLarge
	},
}

func etcdClient(t testing.TB) *clientv3.Client {
	t.Helper()
	return etcdtest.Client(t, etcdtest.Shared(t, etcdClusterSize))
}

func openEtcd(t testing.TB, cli *clientv3.Client, prefix string, fence etcdstore.Fence, opts store.Options) *etcdstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := etcdstore.Open(ctx, cli, prefix, fence, etcdstore.Options{
		MaxBatchesPerCommit: opts.MaxBatchesPerCommit,
		OnCommit:            opts.OnCommit,
		PageSize:            etcdPageSize,
	})
	if err != nil {
		t.Fatalf("etcdstore.Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func tempPath(t testing.TB) string {
	return filepath.Join(t.TempDir(), "snapcoord.db")
}

func mustOpen(t testing.TB, path string, opts store.Options) *store.DB {
	t.Helper()
	db, err := store.Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// reopen closes db and opens its file again, so reads come from disk.
func reopen(t testing.TB, db *store.DB) *store.DB {
	t.Helper()
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return mustOpen(t, db.Path(), store.Options{})
}

func mustCommit(t testing.TB, db store.Store, b *store.Batch) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.Submit(b).Wait(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

func mustLoad(t testing.TB, db store.Store) []*store.RunData {
	t.Helper()
	runs, err := db.Load(context.Background(), store.Everything)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return runs
}
