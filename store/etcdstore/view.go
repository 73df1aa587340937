package etcdstore

import (
	"context"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapcoord/snapcoord/store"
)

// View runs fn over one etcd revision: the first read is linearizable
// (it sees every acknowledged commit) and fixes the revision every later
// read of the view, each range page among them, is served at.
func (s *Store) View(_ context.Context, fn func(store.KV) error) error {
	return fn(&view{s: s})
}

// view is a store.KV pinned to the revision of its first response. Every
// read is one read-only txn of up to MaxTxnOps ranges: etcd serves it
// like a range (linearizable, not through raft), so reading many records
// costs a request per MaxTxnOps of them rather than one each.
type view struct {
	s   *Store
	rev int64 // 0 until the first response
}

// read sends the ranges as one txn and returns their responses in order.
func (v *view) read(ctx context.Context, ops []clientv3.Op) ([]*etcdserverpb.RangeResponse, error) {
	var resp *clientv3.TxnResponse
	err := v.s.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = v.s.cli.Txn(ctx).Then(ops...).Commit()
		return err
	})
	if err != nil {
		return nil, err
	}
	if v.rev == 0 {
		v.rev = resp.Header.Revision
	}
	out := make([]*etcdserverpb.RangeResponse, len(resp.Responses))
	for i, r := range resp.Responses {
		out[i] = r.GetResponseRange()
	}
	return out, nil
}

// get is a range op at the view's revision, once it has one.
func (v *view) get(key string, opts ...clientv3.OpOption) clientv3.Op {
	if v.rev != 0 {
		opts = append(opts, clientv3.WithRev(v.rev))
	}
	return clientv3.OpGet(key, opts...)
}

func (v *view) Get(ctx context.Context, b store.Bucket, key []byte) ([]byte, error) {
	vals, err := v.GetAll(ctx, b, [][]byte{key})
	if err != nil {
		return nil, err
	}
	return vals[0], nil
}

// GetAll reads the keys MaxTxnOps to a txn.
func (v *view) GetAll(ctx context.Context, b store.Bucket, keys [][]byte) ([][]byte, error) {
	vals := make([][]byte, len(keys))
	for start := 0; start < len(keys); start += v.s.opts.MaxTxnOps {
		chunk := keys[start:min(start+v.s.opts.MaxTxnOps, len(keys))]
		ops := make([]clientv3.Op, len(chunk))
		for i, k := range chunk {
			ops[i] = v.get(v.s.key(b, k))
		}
		resps, err := v.read(ctx, ops)
		if err != nil {
			return nil, err
		}
		for i, r := range resps {
			if len(r.Kvs) > 0 {
				vals[start+i] = r.Kvs[0].Value
			}
		}
	}
	return vals, nil
}

// Scan reads the range a page at a time: etcd bounds a response's size.
// A page is no larger than the keys wanted.
func (v *view) Scan(ctx context.Context, b store.Bucket, prefix, from []byte, want int, fn func(k, val []byte) (bool, error)) error {
	page := v.s.opts.PageSize
	if want > 0 {
		page = min(page, int64(want))
	}
	bucket := v.s.key(b, nil)
	start := v.s.key(b, prefix)
	end := clientv3.GetPrefixRangeEnd(start)
	if f := v.s.key(b, from); f > start {
		start = f
	}
	for {
		resps, err := v.read(ctx, []clientv3.Op{v.get(start, clientv3.WithRange(end), clientv3.WithLimit(page))})
		if err != nil {
			return err
		}
		resp := resps[0]
		for _, kv := range resp.Kvs {
			if more, err := fn(kv.Key[len(bucket):], kv.Value); !more || err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// span is what is left to read of ScanAll's range i.
type span struct {
	i          int
	start, end string
}

// ScanAll reads the ranges MaxTxnOps to a txn. The txn's ranges share
// PageSize keys, so that a response is no larger than one page of Scan;
// a range cut short goes on in a later txn.
func (v *view) ScanAll(ctx context.Context, b store.Bucket, prefixes [][]byte, fn func(i int, k, val []byte) error) error {
	todo := make([]span, len(prefixes))
	for i, p := range prefixes {
		start := v.s.key(b, p)
		todo[i] = span{i: i, start: start, end: clientv3.GetPrefixRangeEnd(start)}
	}
	got := make([][]*mvccpb.KeyValue, len(prefixes))
	for len(todo) > 0 {
		n := min(len(todo), v.s.opts.MaxTxnOps)
		limit := max(1, (v.s.opts.PageSize+int64(n)-1)/int64(n))
		ops := make([]clientv3.Op, n)
		for j, sp := range todo[:n] {
			ops[j] = v.get(sp.start, clientv3.WithRange(sp.end), clientv3.WithLimit(limit))
		}
		resps, err := v.read(ctx, ops)
		if err != nil {
			return err
		}
		var more []span
		for j, r := range resps {
			sp := todo[j]
			got[sp.i] = append(got[sp.i], r.Kvs...)
			if r.More && len(r.Kvs) > 0 {
				sp.start = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
				more = append(more, sp)
			}
		}
		todo = append(more, todo[n:]...)
	}
	bucket := len(v.s.key(b, nil))
	for i, kvs := range got {
		for _, kv := range kvs {
			if err := fn(i, kv.Key[bucket:], kv.Value); err != nil {
				return err
			}
		}
	}
	return nil
}
