package etcdstore

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapcoord/snapcoord/store"
)

// View runs fn over one etcd revision: the first read is linearizable
// (it sees every acknowledged commit) and fixes the revision every later
// read of the view, each range page among them, is served at.
func (s *Store) View(_ context.Context, fn func(store.KV) error) error {
	return fn(&view{s: s})
}

// view is a store.KV pinned to the revision of its first response.
type view struct {
	s   *Store
	rev int64 // 0 until the first response
}

func (v *view) get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if v.rev != 0 {
		opts = append(opts, clientv3.WithRev(v.rev))
	}
	var resp *clientv3.GetResponse
	err := v.s.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = v.s.cli.Get(ctx, key, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	if v.rev == 0 {
		v.rev = resp.Header.Revision
	}
	return resp, nil
}

func (v *view) Get(ctx context.Context, b store.Bucket, key []byte) ([]byte, error) {
	resp, err := v.get(ctx, v.s.key(b, key))
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	return resp.Kvs[0].Value, nil
}

// Scan reads the range a page at a time: etcd bounds a response's size.
func (v *view) Scan(ctx context.Context, b store.Bucket, prefix, from []byte, fn func(k, val []byte) (bool, error)) error {
	bucket := v.s.key(b, nil)
	start := v.s.key(b, prefix)
	end := clientv3.GetPrefixRangeEnd(start)
	if f := v.s.key(b, from); f > start {
		start = f
	}
	for {
		resp, err := v.get(ctx, start, clientv3.WithRange(end), clientv3.WithLimit(v.s.opts.PageSize))
		if err != nil {
			return err
		}
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
