package coordinator

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// holdMargin is taken off every bound of leaseHold, for the difference
// between this machine's clock rate and the etcd leader's.
const holdMargin = 100 * time.Millisecond

// leaseHold is how long this coordinator's election lease is known to
// live. etcd expires a lease its TTL after the last keep-alive it
// processed, and it processed each after this coordinator sent it: a
// keep-alive sent at S and answered proves the lease (and so the term led
// with it) lives until S+TTL at least. Past that bound nothing is known:
// the process may have been paused, or cut off from etcd, while another
// coordinator took over; the gate then answers nothing from memory.
//
// The bound is the monotonic clock's, which runs on while the process is
// stopped (SIGSTOP, a frozen VM), exactly the case to catch.
type leaseHold struct {
	mu    sync.Mutex
	until time.Time
}

// renewed records that etcd granted or renewed the lease for ttl in answer
// to a request sent at sent.
func (h *leaseHold) renewed(sent time.Time, ttl time.Duration) {
	until := sent.Add(ttl - holdMargin)
	h.mu.Lock()
	defer h.mu.Unlock()
	if until.After(h.until) {
		h.until = until
	}
}

// held reports whether the lease is known to live now.
func (h *leaseHold) held() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Now().Before(h.until)
}

// keepLease renews the election lease every sixth of the TTL, beside the
// session's own keep-alives (whose send times the etcd client keeps to
// itself), recording each renewal in hold, until ctx ends. A lease etcd no
// longer knows calls lost at once: the term is over.
func (c *Coordinator) keepLease(ctx context.Context, lease clientv3.LeaseID, hold *leaseHold, lost func()) {
	every := c.cfg.ElectionTTL / 6
	for {
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, c.cfg.ElectionTTL)
		resp, err := c.etcd.KeepAliveOnce(rctx, lease)
		cancel()
		switch {
		case err == nil:
			hold.renewed(sent, time.Duration(resp.TTL)*time.Second)
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			lost()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
