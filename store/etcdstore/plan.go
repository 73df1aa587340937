package etcdstore

import (
	"errors"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapcoord/snapcoord/store"
)

// ErrBatchTooLarge means one Batch needs more than one etcd transaction
// may hold; a Batch is never split, so it cannot commit.
var ErrBatchTooLarge = errors.New("etcdstore: batch exceeds the limits of one etcd transaction")

// opOverhead bounds the protobuf framing of one operation in a TxnRequest
// beyond its key and value bytes (tags, lengths, the nested request).
const opOverhead = 32

// limits are one transaction's: etcd refuses a txn with more than
// --max-txn-ops operations or a request over --max-request-bytes.
type limits struct {
	ops   int
	bytes int
}

// txnPlan is a group's changes as one etcd transaction. etcd refuses a
// txn that writes a key twice or puts a key inside a range it deletes, so
// the batches' ordered ops are folded into their net effect: at most one
// put per key, and delete ranges that exclude every key put.
type txnPlan struct {
	puts map[string]put
	dels []keyRange
}

// put is a key's final value; ifAbsent: only if the key is not stored
// before the txn (Batch.PutSnapshotReport).
type put struct {
	val      []byte
	ifAbsent bool
}

// keyRange is [from, to) of etcd keys.
type keyRange struct{ from, to string }

func newTxnPlan() *txnPlan { return &txnPlan{puts: map[string]put{}} }

// planGroup splits a group into transactions within lim, between batches
// only. It fails, before anything is sent, if one batch alone exceeds lim.
func (s *Store) planGroup(group []*store.Batch, lim limits) ([]*txnPlan, error) {
	var txns []*txnPlan
	cur, start := newTxnPlan(), 0
	for i, b := range group {
		cur.addBatch(s, b)
		if cur.fits(lim) {
			continue
		}
		if i > start {
			// Batches start..i-1 fitted together: they are one txn.
			txns = append(txns, s.planOf(group[start:i]))
			cur, start = s.planOf(group[i:i+1]), i
			if cur.fits(lim) {
				continue
			}
		}
		ops, bytes := cur.size()
		return nil, fmt.Errorf("%w: a batch of %d changes makes %d etcd operations and about %d bytes; the limits are %d operations and %d bytes",
			ErrBatchTooLarge, b.Len(), ops, bytes, lim.ops, lim.bytes)
	}
	return append(txns, cur), nil
}

func (s *Store) planOf(batches []*store.Batch) *txnPlan {
	p := newTxnPlan()
	for _, b := range batches {
		p.addBatch(s, b)
	}
	return p
}

func (p *txnPlan) addBatch(s *Store, b *store.Batch) {
	for _, o := range b.Ops() {
		k := s.key(o.Bucket, o.Key)
		switch o.Kind {
		case store.OpPut:
			p.uncover(k)
			p.puts[k] = put{val: o.Val}
		case store.OpPutIfAbsent:
			if _, ok := p.puts[k]; ok {
				break // put earlier in this txn: not absent
			}
			// Deleted earlier in this txn: absent for sure.
			p.puts[k] = put{val: o.Val, ifAbsent: !p.uncover(k)}
		case store.OpDelete:
			p.deleteRange(keyRange{k, k + "\x00"})
		case store.OpDeleteThrough:
			r := keyRange{from: k, to: clientv3.GetPrefixRangeEnd(k)}
			if o.Val != nil {
				r.to = s.key(o.Bucket, o.Val) + "\x00"
			}
			p.deleteRange(r)
		}
	}
}

// deleteRange drops the puts r covers and deletes r.
func (p *txnPlan) deleteRange(r keyRange) {
	for k := range p.puts {
		if r.from <= k && k < r.to {
			delete(p.puts, k)
		}
	}
	p.dels = append(p.dels, r)
}

// uncover takes k out of every delete range, splitting the ranges around
// it, so that it can be put; it reports whether any range covered k.
func (p *txnPlan) uncover(k string) bool {
	covered := false
	next := k + "\x00"
	dels := p.dels[:0:0]
	for _, r := range p.dels {
		if k < r.from || k >= r.to {
			dels = append(dels, r)
			continue
		}
		covered = true
		if r.from < k {
			dels = append(dels, keyRange{r.from, k})
		}
		if next < r.to {
			dels = append(dels, keyRange{next, r.to})
		}
	}
	p.dels = dels
	return covered
}

// size is the txn's operation count and an upper estimate of its bytes.
func (p *txnPlan) size() (ops, bytes int) {
	for k, v := range p.puts {
		bytes += len(k) + len(v.val) + opOverhead
		if v.ifAbsent {
			bytes += len(k) + 2*opOverhead // the nested txn and its compare
		}
	}
	for _, r := range p.dels {
		bytes += len(r.from) + len(r.to) + opOverhead
	}
	return len(p.puts) + len(p.dels), bytes
}

// fits says whether etcd takes the txn. etcd checks a txn nested in it (a
// put-if-absent) against --max-txn-ops minus the outer txn's operation
// count, so with one inside, the outer txn may hold one operation fewer:
// 128 under the default 128 is refused as "too many operations".
func (p *txnPlan) fits(lim limits) bool {
	ops, bytes := p.size()
	if p.nests() {
		ops++
	}
	return ops <= lim.ops && bytes <= lim.bytes
}

func (p *txnPlan) nests() bool {
	for _, v := range p.puts {
		if v.ifAbsent {
			return true
		}
	}
	return false
}

// ops are the txn's operations: deletes, then puts by key. No two touch
// the same key, so their order does not change the outcome.
func (p *txnPlan) ops() []clientv3.Op {
	ops := make([]clientv3.Op, 0, len(p.puts)+len(p.dels))
	for _, r := range p.dels {
		ops = append(ops, clientv3.OpDelete(r.from, clientv3.WithRange(r.to)))
	}
	keys := make([]string, 0, len(p.puts))
	for k := range p.puts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := p.puts[k]
		op := clientv3.OpPut(k, string(v.val))
		if v.ifAbsent {
			op = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)}, []clientv3.Op{op}, nil)
		}
		ops = append(ops, op)
	}
	return ops
}

// describe is a txn's shape, for errors.
func (p *txnPlan) describe() string {
	ops, bytes := p.size()
	return fmt.Sprintf("%d operations (%d puts, %d delete ranges), about %d bytes", ops, len(p.puts), len(p.dels), bytes)
}
