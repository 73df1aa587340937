package store

import (
	"context"
	"fmt"
	"sync"
	"time"
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

// ApplyFunc makes a group of batches durable, all or nothing, in order. It
// is called by one goroutine at a time, with no empty and no invalid batch.
type ApplyFunc func(group []*Batch) error

// CommitOptions tunes a Committer. The zero value is usable.
type CommitOptions struct {
	// MaxBatches caps one group; default 4096.
	MaxBatches int
	// OnCommit, if set, is called by the committer after each successful
	// commit with the number of batches it carried and its duration. It runs
	// on the committer goroutine, so it must be quick and must not wait for
	// a Submit.
	OnCommit func(batches int, d time.Duration)
}

// Committer is the group commit every backend shares: one goroutine hands
// every batch queued at that moment to the backend's ApplyFunc at once, so
// concurrent writers share one durable write while a lone writer never
// waits for company. The first failure poisons it: the writers' memory is
// then ahead of the store, so every later batch fails with the same error.
type Committer struct {
	apply ApplyFunc
	opts  CommitOptions

	// mu orders Submit against Close: a Submit holding the read lock may
	// still send on queue; Close takes the write lock before closing it.
	mu     sync.RWMutex
	closed bool
	queue  chan *Pending

	done      chan struct{}
	closeOnce sync.Once
}

// NewCommitter starts a committer over apply; Close stops it.
func NewCommitter(apply ApplyFunc, opts CommitOptions) *Committer {
	if opts.MaxBatches <= 0 {
		opts.MaxBatches = defaultMaxBatches
	}
	c := &Committer{apply: apply, opts: opts, queue: make(chan *Pending, queueSize), done: make(chan struct{})}
	go c.loop()
	return c
}

// Submit queues b for the next group commit and returns at once, unless the
// queue is full. Batches become durable in Submit order: when one's Done
// closes, every batch submitted before it is durable too. b must not be
// used afterwards.
func (c *Committer) Submit(b *Batch) *Pending {
	if b == nil {
		b = &Batch{}
	}
	p := &Pending{batch: b, done: make(chan struct{})}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		p.finish(ErrClosed)
		return p
	}
	// Even empty batches queue, so their Done keeps Submit order.
	c.queue <- p
	return p
}

// Close waits for every submitted batch to commit or fail and stops the
// committer. Later calls return at once.
func (c *Committer) Close() {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		close(c.queue)
		c.mu.Unlock()
	})
	<-c.done
}

// loop is the only writer. It never waits for more work than is already
// queued, so a lone writer commits immediately.
func (c *Committer) loop() {
	defer close(c.done)
	var poison error
	group := make([]*Pending, 0, c.opts.MaxBatches)
	var work []*Batch
	for first := range c.queue {
		group = c.collect(append(group[:0], first))
		if poison == nil {
			work = appendWork(work[:0], group)
			poison = c.commit(work)
			clear(work)
		}
		for _, p := range group {
			p.finish(poison)
		}
		clear(group) // drop references until the next round
	}
}

// collect adds whatever else is queued right now, up to the cap.
func (c *Committer) collect(group []*Pending) []*Pending {
	for len(group) < c.opts.MaxBatches {
		select {
		case p, ok := <-c.queue:
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

// appendWork appends the batches that need a write; an invalid batch
// counts because it must fail the group.
func appendWork(work []*Batch, group []*Pending) []*Batch {
	for _, p := range group {
		if p.batch.Len() > 0 || p.batch.err != nil {
			work = append(work, p.batch)
		}
	}
	return work
}

// commit applies the work in one group. Its error poisons the committer.
func (c *Committer) commit(work []*Batch) error {
	if len(work) == 0 {
		return nil // only empty batches: nothing to write
	}
	for _, b := range work {
		if b.err != nil {
			// The caller already changed its memory; failing the whole
			// group is as wrong-footed as any other commit failure.
			return fmt.Errorf("%w: %w", ErrCommitFailed, b.err)
		}
	}
	start := time.Now()
	if err := c.apply(work); err != nil {
		return fmt.Errorf("%w: %w", ErrCommitFailed, err)
	}
	if c.opts.OnCommit != nil {
		c.opts.OnCommit(len(work), time.Since(start))
	}
	return nil
}
