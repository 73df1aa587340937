package store

import (
	"bytes"
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Pending is a submitted batch on its way to disk.
type Pending struct {
	batch *Batch
	done  chan struct{}
	err   error // written before done closes
}

// Done is closed once the batch is durable or has failed.
func (p *Pending) Done() <-chan struct{} { return p.done }

// Err reports the batch's outcome; it is valid once Done is closed.
func (p *Pending) Err() error { return p.err }

// Wait blocks until the batch is durable or failed, or ctx ends. A ctx error
// says nothing about the batch: it may still commit.
func (p *Pending) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Pending) finish(err error) {
	p.err = err
	p.batch = nil // let the marshalled bytes go
	close(p.done)
}

// Submit queues b for the next group commit and returns at once, unless the
// queue is full. Batches become durable in Submit order: when one's Done
// closes, every batch submitted before it is durable too. b must not be
// used afterwards.
func (db *DB) Submit(b *Batch) *Pending {
	if b == nil {
		b = &Batch{}
	}
	p := &Pending{batch: b, done: make(chan struct{})}
	db.mu.RLock()
	defer db.mu.RUnlock()
	if db.closed {
		p.finish(ErrClosed)
		return p
	}
	// Even empty batches queue, so their Done keeps Submit order.
	db.queue <- p
	return p
}

// commitLoop is the only writer after Open. It never waits for more work
// than is already queued, so a lone writer commits immediately.
func (db *DB) commitLoop() {
	defer close(db.committerDone)
	var poison error
	group := make([]*Pending, 0, db.opts.MaxBatchesPerCommit)
	for first := range db.queue {
		group = db.collect(append(group[:0], first))
		if poison == nil {
			poison = db.commit(group)
		}
		for _, p := range group {
			p.finish(poison)
		}
		clear(group) // drop references until the next round
	}
}

// collect adds whatever else is queued right now, up to the cap.
func (db *DB) collect(group []*Pending) []*Pending {
	for len(group) < db.opts.MaxBatchesPerCommit {
		select {
		case p, ok := <-db.queue:
			if !ok {
				return group
			}
			group = append(group, p)
		default:
			return group
		}
	}
	return group
}

// commit applies the group in one transaction. Its error poisons the DB.
func (db *DB) commit(group []*Pending) error {
	n := countWork(group)
	if n == 0 {
		return nil // only empty batches: nothing to write or fsync
	}
	start := time.Now()
	db.commitMu.Lock()
	err := db.bolt.Update(func(tx *bolt.Tx) error { return apply(tx, group) })
	db.commitMu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCommitFailed, err)
	}
	if db.opts.OnCommit != nil {
		db.opts.OnCommit(n, time.Since(start))
	}
	return nil
}

// countWork counts batches that need the transaction; an invalid batch
// counts because it must fail it.
func countWork(group []*Pending) int {
	n := 0
	for _, p := range group {
		if p.batch.Len() > 0 || p.batch.err != nil {
			n++
		}
	}
	return n
}

func apply(tx *bolt.Tx, group []*Pending) error {
	var buckets [len(allBuckets)]*bolt.Bucket
	for i, name := range allBuckets {
		buckets[i] = tx.Bucket(name)
	}
	for _, p := range group {
		if p.batch.err != nil {
			// The caller already changed its memory; failing the whole
			// commit is as wrong-footed as any other commit failure.
			return p.batch.err
		}
		for _, o := range p.batch.ops {
			if err := applyOp(buckets[o.bucket], o); err != nil {
				return fmt.Errorf("%s %q: %w", allBuckets[o.bucket], o.key, err)
			}
		}
	}
	return nil
}

func applyOp(b *bolt.Bucket, o op) error {
	switch o.kind {
	case opPut:
		return b.Put(o.key, o.val)
	case opPutIfAbsent:
		if b.Get(o.key) != nil {
			return nil
		}
		return b.Put(o.key, o.val)
	case opDelete:
		return b.Delete(o.key)
	}
	return deleteRange(b, o.key, o.val)
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
