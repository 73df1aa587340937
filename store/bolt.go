package store

import (
	"bytes"
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// apply is the bbolt DB's ApplyFunc: the group in one read-write
// transaction, whose commit is two fsyncs.
func (db *DB) apply(group []*Batch) error {
	db.commitMu.Lock()
	defer db.commitMu.Unlock()
	return db.bolt.Update(func(tx *bolt.Tx) error {
		var buckets [len(allBuckets)]*bolt.Bucket
		for i, name := range allBuckets {
			buckets[i] = tx.Bucket(name)
		}
		for _, b := range group {
			for _, o := range b.ops {
				if err := applyOp(buckets[o.Bucket], o); err != nil {
					return fmt.Errorf("%s %q: %w", o.Bucket, o.Key, err)
				}
			}
		}
		return nil
	})
}

func applyOp(b *bolt.Bucket, o Op) error {
	switch o.Kind {
	case OpPut:
		return b.Put(o.Key, o.Val)
	case OpPutIfAbsent:
		if b.Get(o.Key) != nil {
			return nil
		}
		return b.Put(o.Key, o.Val)
	case OpDelete:
		return b.Delete(o.Key)
	}
	return deleteRange(b, o.Key, o.Val)
}

// deleteRange deletes keys with the prefix up to and including last, or
// all of them if last is nil. Keys are copied first: deleting under a live
// cursor can skip entries.
func deleteRange(b *bolt.Bucket, prefix, last []byte) error {
	var doomed [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && (last == nil || bytes.Compare(k, last) <= 0); k, _ = c.Next() {
		doomed = append(doomed, bytes.Clone(k))
	}
	for _, k := range doomed {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// View runs fn over one bbolt read transaction.
func (db *DB) View(ctx context.Context, fn func(KV) error) error {
	return db.bolt.View(func(tx *bolt.Tx) error { return fn(boltKV{tx}) })
}

// boltKV is a read transaction as a KV.
type boltKV struct{ tx *bolt.Tx }

func (kv boltKV) Get(_ context.Context, b Bucket, key []byte) ([]byte, error) {
	return kv.tx.Bucket(allBuckets[b]).Get(key), nil
}

func (kv boltKV) Scan(_ context.Context, b Bucket, prefix, from []byte, _ int, fn func(k, v []byte) (bool, error)) error {
	c := kv.tx.Bucket(allBuckets[b]).Cursor()
	start := prefix
	if bytes.Compare(from, prefix) > 0 {
		start = from
	}
	var k, v []byte
	if start == nil {
		k, v = c.First()
	} else {
		k, v = c.Seek(start)
	}
	for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if more, err := fn(k, v); !more || err != nil {
			return err
		}
	}
	return nil
}

// GetAll is one Get per key: each is a lookup in the mapped file.
func (kv boltKV) GetAll(_ context.Context, b Bucket, keys [][]byte) ([][]byte, error) {
	bk := kv.tx.Bucket(allBuckets[b])
	vals := make([][]byte, len(keys))
	for i, k := range keys {
		vals[i] = bk.Get(k)
	}
	return vals, nil
}

// ScanAll is one Scan per prefix.
func (kv boltKV) ScanAll(ctx context.Context, b Bucket, prefixes [][]byte, fn func(i int, k, v []byte) error) error {
	for i, p := range prefixes {
		err := kv.Scan(ctx, b, p, nil, 0, func(k, v []byte) (bool, error) { return true, fn(i, k, v) })
		if err != nil {
			return err
		}
	}
	return nil
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
