package store_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/snapcoord/snapcoord/store"
)

// writeRawVersion creates a bbolt file whose meta holds version v.
func writeRawVersion(t *testing.T, path string, v uint64) {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	err = bdb.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists([]byte(store.MetaBucket.String()))
		if err != nil {
			return err
		}
		return meta.Put(store.SchemaVersionKey, binary.BigEndian.AppendUint64(nil, v))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func readRawVersion(t *testing.T, path string) uint64 {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	var v uint64
	err = bdb.View(func(tx *bolt.Tx) error {
		v = binary.BigEndian.Uint64(tx.Bucket([]byte(store.MetaBucket.String())).Get(store.SchemaVersionKey))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestSchemaFreshFile(t *testing.T) {
	path := tempPath(t)
	db := mustOpen(t, path, store.Options{})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if v := readRawVersion(t, path); v != store.SchemaVersion {
		t.Fatalf("fresh file has schema version %d, want %d", v, store.SchemaVersion)
	}
}

func TestSchemaNewerRefused(t *testing.T) {
	path := tempPath(t)
	writeRawVersion(t, path, store.SchemaVersion+1)
	_, err := store.Open(path, store.Options{})
	if !errors.Is(err, store.ErrNewerSchema) {
		t.Fatalf("Open: %v, want ErrNewerSchema", err)
	}
	for _, s := range []string{path, fmt.Sprint(store.SchemaVersion), fmt.Sprint(store.SchemaVersion + 1)} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	if v := readRawVersion(t, path); v != store.SchemaVersion+1 {
		t.Fatalf("refused file changed to version %d", v)
	}
}

func TestSchemaMigration(t *testing.T) {
	path := tempPath(t)
	writeRawVersion(t, path, store.SchemaVersion-1)
	if _, err := store.Open(path, store.Options{}); err == nil || !strings.Contains(err.Error(), "no migration") {
		t.Fatalf("Open without a migration: %v", err)
	}

	ran := false
	store.SetMigration(t, store.SchemaVersion-1, func(tx *bolt.Tx) error { ran = true; return nil })
	db := mustOpen(t, path, store.Options{})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatal("migration did not run")
	}
	if v := readRawVersion(t, path); v != store.SchemaVersion {
		t.Fatalf("migrated file has version %d, want %d", v, store.SchemaVersion)
	}
}

func TestOpenForeignFile(t *testing.T) {
	path := tempPath(t)
	bdb, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err })
	if err != nil {
		t.Fatal(err)
	}
	bdb.Close()
	if _, err := store.Open(path, store.Options{}); err == nil || !strings.Contains(err.Error(), "not a snapcoord store") {
		t.Fatalf("Open of a foreign bbolt file: %v", err)
	}
}

func TestLocked(t *testing.T) {
	path := tempPath(t)
	mustOpen(t, path, store.Options{})
	errc := make(chan error, 1)
	go func() {
		db, err := store.Open(path, store.Options{LockTimeout: 100 * time.Millisecond})
		if err == nil {
			db.Close()
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, store.ErrLocked) {
			t.Fatalf("second Open: %v, want ErrLocked", err)
		}
		if !strings.Contains(err.Error(), filepath.Dir(path)) {
			t.Fatalf("error %q does not name the directory", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second Open did not give up on the lock")
	}
}

func TestWaitContext(t *testing.T) {
	p := store.NewPending()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait: %v, want context.Canceled", err)
	}
}

func TestCheck(t *testing.T) {
	db := mustOpen(t, tempPath(t), store.Options{})
	_, b := fixture("r")
	mustCommit(t, db, b)
	if err := db.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

func TestLoadManyRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 workers")
	}
	db := mustOpen(t, tempPath(t), store.Options{})
	writeManyRuns(t, db, 1000, 100)
	db = reopen(t, db)
	start := time.Now()
	runs := mustLoad(t, db)
	t.Logf("loaded %d runs with %d workers each in %v", len(runs), len(runs[0].Workers), time.Since(start))
	if len(runs) != 1000 || len(runs[999].Workers) != 100 {
		t.Fatalf("loaded %d runs", len(runs))
	}
}
