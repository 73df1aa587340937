package leader

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// holdMargin is taken off every bound of leaseHold, for the difference
// between this machine's clock rate and the etcd leader's.
const holdMargin = 100 * time.Millisecond

// leaseHold is how long this coordinator's election lease is known to
// live (Hold). etcd expires a lease its TTL after the last
// keep-alive it processed, and it processed each after this coordinator
// sent it: a keep-alive sent at S and answered proves the lease (and so
// the term led with it) lives until S+TTL at least. Past that bound
// nothing is known: the process may have been paused, or cut off from
// etcd, while another coordinator took over; the gate then asks etcd
// before it answers anything from memory.
//
// The bound is the monotonic clock's, which runs on while the process is
// stopped (SIGSTOP, a frozen VM), exactly the case to catch.
type leaseHold struct {
	etcd  *clientv3.Client
	lease clientv3.LeaseID
	ttl   time.Duration // the bound of one renewal's wait
	lost  func()        // the term is over: etcd no longer knows the lease

	mu    sync.Mutex
	until time.Time
	sent  time.Time // when the latest answered renewal was sent
	gone  atomic.Bool
	// asking lets one renewal at a time be made for Confirm, however many
	// calls ask at once.
	asking chan struct{}
}

func newLeaseHold(etcd *clientv3.Client, ttl time.Duration) *leaseHold {
	return &leaseHold{etcd: etcd, ttl: ttl, lost: func() {}, asking: make(chan struct{}, 1)}
}

// renewed records that etcd granted or renewed the lease for ttl in answer
// to a request sent at sent.
func (h *leaseHold) renewed(sent time.Time, ttl time.Duration) {
	until := sent.Add(ttl - holdMargin)
	h.mu.Lock()
	defer h.mu.Unlock()
	if until.After(h.until) {
		h.until, h.sent = until, sent
	}
}

// Held reports whether the lease is known to live now.
func (h *leaseHold) Held() bool { return h.heldSince(time.Time{}) }

// heldSince is Held, counting only a renewal sent at from or later.
func (h *leaseHold) heldSince(from time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.gone.Load() && time.Now().Before(h.until) && !h.sent.Before(from)
}

// Confirm renews the lease to learn whether it lives: true once it did,
// false when etcd no longer knows it (the term is over) or ctx ends first.
// While etcd has no quorum it keeps asking: etcd expires no lease then, and
// a call waits for quorum's return as its commit would, rather than be
// refused and retried after a backoff.
func (h *leaseHold) Confirm(ctx context.Context) bool { return h.confirm(ctx, time.Time{}) }

// Reconfirm is Confirm by a renewal sent from now on: what an earlier one
// proved does not count. It answers whether the lease outlived something
// that has just happened, such as the election session's keep-alive giving
// up (after a TTL without an answer, as while etcd has no quorum): a
// renewal of the hold's own, answered a moment before the outage began,
// may still bound the lease past that moment without saying anything of
// the outage.
func (h *leaseHold) Reconfirm(ctx context.Context) bool { return h.confirm(ctx, time.Now()) }

// confirm renews the lease until a renewal sent at from or later is
// answered (true), etcd no longer knows the lease, or ctx ends (false).
func (h *leaseHold) confirm(ctx context.Context, from time.Time) bool {
	select {
	case h.asking <- struct{}{}:
		defer func() { <-h.asking }()
	case <-ctx.Done():
		return false
	}
	for {
		if h.heldSince(from) { // renewed, by this loop or while this call waited
			return true
		}
		if errors.Is(h.renew(ctx), rpctypes.ErrLeaseNotFound) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(confirmRetry):
		}
	}
}

// confirmRetry is the pause between two renewals Confirm makes.
const confirmRetry = 100 * time.Millisecond

// renew sends one keep-alive and records its answer.
func (h *leaseHold) renew(ctx context.Context) error {
	if h.gone.Load() {
		return rpctypes.ErrLeaseNotFound
	}
	ctx, cancel := context.WithTimeout(ctx, h.ttl)
	defer cancel()
	sent := time.Now()
	resp, err := h.etcd.KeepAliveOnce(ctx, h.lease)
	switch {
	case err == nil:
		h.renewed(sent, time.Duration(resp.TTL)*time.Second)
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		h.gone.Store(true)
		h.lost()
	}
	return err
}

// keep renews the lease every sixth of the TTL, beside the session's own
// keep-alives (whose send times the etcd client keeps to itself), until
// ctx ends or the lease is gone.
func (h *leaseHold) keep(ctx context.Context) {
	for {
		if errors.Is(h.renew(ctx), rpctypes.ErrLeaseNotFound) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.ttl / 6):
		}
	}
}
