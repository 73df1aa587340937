// Package store persists snapcoord's state: the Store interface the
// engine holds, the record layout and its decoding, the group commit every
// backend shares, and the embedded backend, one bbolt file (DB). The etcd
// backend is store/etcdstore.
//
// Writes go through Submit, which group-commits: one committer goroutine
// applies every batch queued at that moment in a single transaction, so
// concurrent writers share one durable write while a lone writer never
// waits for company. State is read once, at startup, through Load; the
// other reads fetch what memory does not hold.
package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	storagev1 "github.com/snapcoord/snapcoord/api/snapcoord/storage/v1"
	snapcoordv1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Store is a backend as the engine holds it: the engine must not know which
// one it has.
type Store interface {
	// Submit queues a batch for the next group commit (see Committer).
	Submit(b *Batch) *Pending
	// Load reads every run (see Reader.Load).
	Load(ctx context.Context, w Window) ([]*RunData, error)
	// Events reads stored events older than Load's window.
	Events(runID string, after, upTo int64, limit int) ([]*snapcoordv1.RunEvent, error)
	// Step reads one step older than Load's window.
	Step(runID string, step int64) (*storagev1.StepRecord, error)
	// Snapshots reads snapshots in full, with their reports.
	Snapshots(ctx context.Context, runID string, ids []string, yield func(*snapcoordv1.Snapshot) bool) error
	// SnapshotReport reads one worker's stored report on a snapshot.
	SnapshotReport(runID, snapshotID, workerID string) (*snapcoordv1.SnapshotReport, error)
	// Close waits for every submitted batch and releases the backend.
	Close() error
}

// SchemaVersion is the layout version this binary reads and writes.
const SchemaVersion = 1

var (
	// ErrLocked means another process holds the data file's lock.
	ErrLocked = errors.New("store: data file is locked by another process")
	// ErrNewerSchema means the file was written by a newer snapcoord.
	ErrNewerSchema = errors.New("store: schema version is newer than this binary supports")
	// ErrClosed is returned for batches submitted after Close.
	ErrClosed = errors.New("store: closed")
	// ErrCommitFailed means a commit failed. The store is then poisoned:
	// the caller's memory is ahead of the disk, so every later write fails too.
	ErrCommitFailed = errors.New("store: commit failed; the store accepts no more writes")
	// ErrFenced means a commit was refused because this process no longer
	// holds the right to write (another coordinator took over); it comes
	// wrapped with ErrCommitFailed.
	ErrFenced = errors.New("store: fenced: another coordinator holds the store")
)

const (
	defaultLockTimeout = time.Second
	defaultMaxBatches  = 4096
	queueSize          = 8192
)

var (
	bucketMeta      = []byte("meta")
	bucketRuns      = []byte("runs")
	bucketSteps     = []byte("steps")
	bucketWorkers   = []byte("workers")
	bucketSnapshots = []byte("snapshots")
	bucketEvents    = []byte("events")
	bucketCommands  = []byte("commands")
	bucketReports   = []byte("reports")

	// SchemaVersionKey is the key of the schema version in MetaBucket.
	SchemaVersionKey = []byte("schema_version")
)

// allBuckets is indexed by Bucket, so batches refer to buckets by number.
var allBuckets = [...][]byte{
	idMeta:      bucketMeta,
	idRuns:      bucketRuns,
	idSteps:     bucketSteps,
	idWorkers:   bucketWorkers,
	idSnapshots: bucketSnapshots,
	idEvents:    bucketEvents,
	idCommands:  bucketCommands,
	idReports:   bucketReports,
}

// Bucket is one of the store's key spaces (a bbolt bucket, an etcd key
// prefix); its String is its name.
type Bucket uint8

func (b Bucket) String() string { return string(allBuckets[b]) }

// Buckets are every bucket, MetaBucket first.
func Buckets() []Bucket {
	bs := make([]Bucket, len(allBuckets))
	for i := range bs {
		bs[i] = Bucket(i)
	}
	return bs
}

const (
	idMeta Bucket = iota // MetaBucket
	idRuns
	idSteps
	idWorkers
	idSnapshots
	idEvents
	idCommands
	idReports
)

// MetaBucket holds the store's own records: SchemaVersionKey.
const MetaBucket = idMeta

// migrations[v] upgrades a file from schema version v to v+1 inside the
// opening transaction. Empty while the layout has never changed; a variable
// so tests can exercise the mechanism.
var migrations = map[uint64]func(tx *bolt.Tx) error{}

// Options tunes a DB. The zero value is usable.
type Options struct {
	// LockTimeout bounds the wait for the file lock; default 1s.
	LockTimeout time.Duration
	// MaxBatchesPerCommit caps one group commit; default 4096.
	MaxBatchesPerCommit int
	// OnCommit, if set, is called by the committer after each successful
	// commit with the number of batches it carried and its duration. It runs
	// on the committer goroutine, so it must be quick and must not wait for
	// a Submit.
	OnCommit func(batches int, d time.Duration)
}

func (o Options) withDefaults() Options {
	if o.LockTimeout == 0 {
		o.LockTimeout = defaultLockTimeout
	}
	if o.MaxBatchesPerCommit <= 0 {
		o.MaxBatchesPerCommit = defaultMaxBatches
	}
	return o
}

// DB is an open store file.
type DB struct {
	Reader
	*Committer
	bolt *bolt.DB
	path string

	// commitMu keeps Check's read transaction away from commits: bbolt's
	// check reads the shared freelist without a lock of its own.
	commitMu sync.Mutex

	closeOnce sync.Once
	closeErr  error
}

var _ Store = (*DB)(nil)

// Open opens or creates the store file at path; its directory must exist.
func Open(path string, opts Options) (*DB, error) {
	opts = opts.withDefaults()
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:      opts.LockTimeout,
		FreelistType: bolt.FreelistMapType,
	})
	if err != nil {
		return nil, openError(path, opts.LockTimeout, err)
	}
	if err := bdb.Update(func(tx *bolt.Tx) error { return prepare(tx, path) }); err != nil {
		_ = bdb.Close()
		return nil, err
	}
	db := &DB{bolt: bdb, path: path}
	db.Reader = Reader{Viewer: db}
	db.Committer = NewCommitter(db.apply, CommitOptions{MaxBatches: opts.MaxBatchesPerCommit, OnCommit: opts.OnCommit})
	return db, nil
}

func openError(path string, timeout time.Duration, err error) error {
	if errors.Is(err, berrors.ErrTimeout) {
		return &lockedError{dir: filepath.Dir(path), timeout: timeout, cause: err}
	}
	return fmt.Errorf("store: open %s: %w", path, err)
}

// lockedError carries the operator-facing message; errors.Is matches
// ErrLocked without repeating its text.
type lockedError struct {
	dir     string
	timeout time.Duration
	cause   error
}

func (e *lockedError) Error() string {
	return fmt.Sprintf("data directory %q is in use by another snapcoord process (file lock not acquired within %s)",
		e.dir, e.timeout)
}

func (e *lockedError) Is(target error) bool { return target == ErrLocked }
func (e *lockedError) Unwrap() error        { return e.cause }

// prepare brings a file to SchemaVersion, or refuses it, in the opening
// transaction, so a refused file is left untouched.
func prepare(tx *bolt.Tx, path string) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		if k, _ := tx.Cursor().First(); k != nil {
			return fmt.Errorf("store: %s is not a snapcoord store (no meta bucket)", path)
		}
		return initialize(tx)
	}
	v, err := readVersion(meta, path)
	if err != nil {
		return err
	}
	if v > SchemaVersion {
		return CheckSchemaVersion(path, v)
	}
	if v < SchemaVersion {
		if err := migrate(tx, v, path); err != nil {
			return err
		}
	}
	return createBuckets(tx)
}

func initialize(tx *bolt.Tx) error {
	if err := createBuckets(tx); err != nil {
		return err
	}
	return writeVersion(tx, SchemaVersion)
}

func createBuckets(tx *bolt.Tx) error {
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("store: create bucket %s: %w", name, err)
		}
	}
	return nil
}

func readVersion(meta *bolt.Bucket, path string) (uint64, error) {
	return ParseSchemaVersion(path, meta.Get(SchemaVersionKey))
}

// ParseSchemaVersion decodes the stored meta/schema_version record of the
// store named where.
func ParseSchemaVersion(where string, raw []byte) (uint64, error) {
	if len(raw) != 8 {
		return 0, fmt.Errorf("store: %s: meta/schema_version is missing or malformed (%d bytes)", where, len(raw))
	}
	return binary.BigEndian.Uint64(raw), nil
}

// CheckSchemaVersion refuses a stored version other than SchemaVersion, for
// a backend without migrations: a newer one with ErrNewerSchema.
func CheckSchemaVersion(where string, v uint64) error {
	switch {
	case v > SchemaVersion:
		return fmt.Errorf("%w: %s has schema version %d, this binary supports up to %d",
			ErrNewerSchema, where, v, SchemaVersion)
	case v < SchemaVersion:
		return fmt.Errorf("store: %s: no migration from schema version %d", where, v)
	}
	return nil
}

// SchemaVersionValue is the meta/schema_version record of SchemaVersion.
func SchemaVersionValue() []byte {
	return binary.BigEndian.AppendUint64(nil, SchemaVersion)
}

func writeVersion(tx *bolt.Tx, v uint64) error {
	var raw [8]byte
	binary.BigEndian.PutUint64(raw[:], v)
	if err := tx.Bucket(bucketMeta).Put(SchemaVersionKey, raw[:]); err != nil {
		return fmt.Errorf("store: write schema version: %w", err)
	}
	return nil
}

func migrate(tx *bolt.Tx, from uint64, path string) error {
	for v := from; v < SchemaVersion; v++ {
		m, ok := migrations[v]
		if !ok {
			return fmt.Errorf("store: %s: no migration from schema version %d", path, v)
		}
		if err := m(tx); err != nil {
			return fmt.Errorf("store: %s: migrate schema %d to %d: %w", path, v, v+1, err)
		}
	}
	return writeVersion(tx, SchemaVersion)
}

// Path returns the file path the DB was opened with.
func (db *DB) Path() string { return db.path }

// Close waits for every submitted batch to commit, stops the committer and
// closes the file. Later calls return the first call's result.
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		db.Committer.Close()
		db.closeErr = db.bolt.Close()
	})
	return db.closeErr
}
