// Package etcdstore is the store backend on etcd, for several coordinators
// of which one, the leader, writes: the bbolt store's records under a key
// prefix, group commit as etcd transactions, each fenced on the leader's
// election key so that a deposed leader never writes again.
//
// A record of bucket b and key k is the etcd key <prefix>/store/<b>/<k>,
// so keys sort as in bbolt and Load reads each bucket as one range.
package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/snapcoord/snapcoord/store"
)

// Fence is the condition of every write: Key's create revision is still
// Revision. With the leader's election key (concurrency.Election.Key and
// Rev), a write commits only while this coordinator's campaign holds the
// leadership: a successor's key has another revision. Key "" writes
// unfenced.
type Fence struct {
	Key      string
	Revision int64
}

// Options tunes a Store. The zero value is usable.
type Options struct {
	// MaxBatchesPerCommit caps one group commit; default 4096. A group
	// takes as many transactions as etcd's limits require.
	MaxBatchesPerCommit int
	// OnCommit is as store.Options.OnCommit; its duration covers every
	// transaction of the group.
	OnCommit func(batches int, d time.Duration)
	// MaxTxnOps is the etcd cluster's --max-txn-ops; default 128.
	MaxTxnOps int
	// MaxRequestBytes is the etcd cluster's --max-request-bytes; default
	// 1.5 MiB. Transactions keep a margin below it for etcd's own framing.
	MaxRequestBytes int
	// RequestTimeout bounds one attempt of a request; default 5 s. A
	// request to a member that stopped answering is sent again, to another.
	RequestTimeout time.Duration
	// Timeout bounds a transaction or read with its attempts; default 60 s.
	// A transaction that fails for that long fails its group, and the store
	// accepts no more writes.
	Timeout time.Duration
	// PageSize is how many keys one range read returns; default 1000.
	PageSize int64
}

const (
	defaultMaxTxnOps       = 128
	defaultMaxRequestBytes = 3 << 19 // 1.5 MiB
	requestMargin          = 16 << 10
	defaultRequestTimeout  = 5 * time.Second
	defaultTimeout         = time.Minute
	defaultPageSize        = 1000
)

func (o Options) withDefaults() Options {
	if o.MaxTxnOps <= 0 {
		o.MaxTxnOps = defaultMaxTxnOps
	}
	if o.MaxRequestBytes <= 0 {
		o.MaxRequestBytes = defaultMaxRequestBytes
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = defaultRequestTimeout
	}
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	if o.PageSize <= 0 {
		o.PageSize = defaultPageSize
	}
	return o
}

// Store is a store.Store on etcd.
type Store struct {
	store.Reader
	*store.Committer
	cli    *clientv3.Client
	base   string // the prefix Open was given
	prefix string // <base>/store/
	fence  Fence
	opts   Options
	lim    limits
}

var _ store.Store = (*Store)(nil)

// Open opens the store under prefix through cli, which stays the caller's
// to close after Close. It writes the schema version if the prefix holds
// none yet, fenced like every write, and refuses one it cannot read.
func Open(ctx context.Context, cli *clientv3.Client, prefix string, fence Fence, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	s := &Store{
		cli:    cli,
		base:   prefix,
		prefix: strings.TrimSuffix(prefix, "/") + "/store/",
		fence:  fence,
		opts:   opts,
		lim:    limits{ops: opts.MaxTxnOps, bytes: opts.MaxRequestBytes - requestMargin},
	}
	if err := s.prepare(ctx); err != nil {
		return nil, err
	}
	s.Reader = store.Reader{Viewer: s}
	s.Committer = store.NewCommitter(s.apply, store.CommitOptions{MaxBatches: opts.MaxBatchesPerCommit, OnCommit: opts.OnCommit})
	return s, nil
}

// prepare writes the schema version unless one is stored, and checks it,
// in one fenced transaction.
func (s *Store) prepare(ctx context.Context) error {
	where := fmt.Sprintf("etcd prefix %q", strings.TrimSuffix(s.prefix, "/"))
	k := s.key(store.MetaBucket, store.SchemaVersionKey)
	var resp *clientv3.TxnResponse
	err := s.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = s.cli.Txn(ctx).If(s.fenceCmps()...).Then(
			clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(k, string(store.SchemaVersionValue()))}, nil),
			clientv3.OpGet(k),
		).Commit()
		return err
	})
	if err != nil {
		return fmt.Errorf("etcdstore: open %s: %w", where, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcdstore: open %s: %w", where, s.fencedError())
	}
	var raw []byte
	if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) == 1 {
		raw = kvs[0].Value
	}
	v, err := store.ParseSchemaVersion(where, raw)
	if err != nil {
		return err
	}
	return store.CheckSchemaVersion(where, v)
}

// Close waits for every submitted batch to commit or fail. It leaves the
// client open.
func (s *Store) Close() error {
	s.Committer.Close()
	return nil
}

// Client is the client the store was opened with.
func (s *Store) Client() *clientv3.Client { return s.cli }

// Prefix is the prefix the store was opened with.
func (s *Store) Prefix() string { return s.base }

// Fence is the fence the store was opened with.
func (s *Store) Fence() Fence { return s.fence }

// Key is the etcd key of the record with key k in bucket b.
func (s *Store) Key(b store.Bucket, k []byte) string { return s.key(b, k) }

func (s *Store) key(b store.Bucket, k []byte) string {
	return s.prefix + b.String() + "/" + string(k)
}

func (s *Store) fenceCmps() []clientv3.Cmp {
	if s.fence.Key == "" {
		return nil
	}
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.fence.Key), "=", s.fence.Revision)}
}

func (s *Store) fencedError() error {
	return fmt.Errorf("%w (etcd key %q no longer has create revision %d)", store.ErrFenced, s.fence.Key, s.fence.Revision)
}

// apply is the Store's store.ApplyFunc: the group as the fewest fenced
// transactions etcd's limits allow, one after another. Each is idempotent
// (puts of fixed values, put-if-absent, deletes), so one whose outcome is
// unknown is sent again. A group that fails after some of its transactions
// committed leaves them: its batches were not acknowledged, and a
// successor's Load finds whole batches only.
func (s *Store) apply(group []*store.Batch) error {
	txns, err := s.planGroup(group, s.lim)
	if err != nil {
		return err
	}
	for i, t := range txns {
		if err := s.commitTxn(t); err != nil {
			return fmt.Errorf("etcdstore: transaction %d of %d (%s): %w", i+1, len(txns), t.describe(), err)
		}
	}
	return nil
}

func (s *Store) commitTxn(t *txnPlan) error {
	ops := t.ops()
	var resp *clientv3.TxnResponse
	err := s.retry(context.Background(), func(ctx context.Context) (err error) {
		resp, err = s.cli.Txn(ctx).If(s.fenceCmps()...).Then(ops...).Commit()
		return err
	})
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return s.fencedError()
	}
	return nil
}

// retry calls do until it succeeds, fails for good, or Timeout passes;
// each attempt gets RequestTimeout.
func (s *Store) retry(ctx context.Context, do func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	wait := 50 * time.Millisecond
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, s.opts.RequestTimeout)
		err := do(attempt)
		cancelAttempt()
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		wait = min(2*wait, time.Second)
	}
}

// retryable tells errors of the moment (no leader, a member gone, an
// attempt's timeout) from those of the request (too many operations, too
// large), which another attempt would repeat.
func retryable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	if st, ok := status.FromError(err); ok {
		return st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded
	}
	return false
}
