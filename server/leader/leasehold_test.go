package leader

import (
	"context"
	"testing"
	"time"

	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
)

// A leader that wakes from a pause past its lease's known bound asks etcd
// before it answers: a lease still alive (a short pause, or a quorum loss,
// during which etcd expires nothing) is confirmed and renewed; a lease etcd
// no longer knows (another coordinator may lead) is not, and the term ends.
func TestLeaseHoldAfterAPause(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	h := newLeaseHold(cli, 2*time.Second)
	lease, err := cli.Grant(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan struct{})
	h.lease, h.lost = lease.ID, func() { close(lost) }
	if h.Held() {
		t.Fatal("held before any grant or renewal was recorded")
	}
	if !h.Confirm(t.Context()) || !h.Held() {
		t.Fatal("a live lease was not confirmed")
	}

	pause := func() { h.mu.Lock(); h.until = time.Now().Add(-time.Second); h.mu.Unlock() }
	pause()
	if h.Held() {
		t.Fatal("held past the bound of its last renewal")
	}
	if !h.Confirm(t.Context()) || !h.Held() {
		t.Fatal("a lease that outlived a short pause was not confirmed")
	}

	if _, err := cli.Revoke(t.Context(), lease.ID); err != nil { // as if it had expired
		t.Fatal(err)
	}
	pause()
	if h.Confirm(t.Context()) || h.Held() {
		t.Fatal("a lease etcd no longer knows was confirmed")
	}
	select {
	case <-lost:
	default:
		t.Fatal("the term was not ended when etcd no longer knew its lease")
	}
}

// The election session's keep-alive gives up on the lease after a TTL
// without an answer, as while etcd has no quorum. Whether the lease
// outlived that is learned from a renewal sent afterwards: one the hold
// made just before etcd went silent still bounds the lease for a while,
// and taken as an answer it kept the term (and calls waiting on commits
// that could not come) through a whole quorum loss.
func TestLeaseHoldReconfirmCountsOnlyALaterRenewal(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const ttl = 5 * time.Second
	h := newLeaseHold(cli, ttl)
	lease, err := cli.Grant(t.Context(), int64(ttl/time.Second))
	if err != nil {
		t.Fatal(err)
	}
	h.lease = lease.ID
	if !h.Confirm(t.Context()) {
		t.Fatal("a live lease was not confirmed")
	}

	if err := etcd.Stop(0); err != nil { // etcd answers nothing
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := etcd.Cont(0); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)
	if !h.Confirm(t.Context()) {
		t.Fatal("Confirm refused a lease its last renewal still bounds")
	}
	silent, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if h.Reconfirm(silent) {
		t.Fatal("Reconfirm took the renewal made before etcd went silent as an answer")
	}

	resume()
	if !h.Reconfirm(t.Context()) || !h.Held() {
		t.Fatal("a lease that outlived the silence was not reconfirmed once etcd answered")
	}
}
