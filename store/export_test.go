package store

import bolt "go.etcd.io/bbolt"

// Hooks for the external tests (package store_test), which also run the
// etcd backend and so cannot be in package store.

// PutRaw stores val under key in bucket b, bypassing Batch.
func (db *DB) PutRaw(b Bucket, key, val []byte) error {
	return db.apply([]*Batch{{ops: []Op{{Kind: OpPut, Bucket: b, Key: key, Val: val}}}})
}

// BucketWorkers is the workers bucket.
const BucketWorkers = idWorkers

// NameKey is the key of a run's named record.
var NameKey = nameKey

// SetMigration installs migration f from schema version v until the test
// ends.
func SetMigration(t interface{ Cleanup(func()) }, v uint64, f func(tx *bolt.Tx) error) {
	migrations[v] = f
	t.Cleanup(func() { delete(migrations, v) })
}

// NewPending is a batch that never completes.
func NewPending() *Pending { return &Pending{done: make(chan struct{})} }
