package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/store"
	"github.com/snapcoord/snapcoord/store/etcdstore"
)

// With the etcd store, the coordinators sharing a prefix elect a leader
// (etcd's concurrency election under <prefix>/leader, the value being the
// leader's advertised address). Each term won opens the store fenced by
// the election key, loads the engine from it as a restart does, and opens
// the gate; the term ends when the session's lease is lost, a commit is
// refused or the engine fails otherwise, or the coordinator shuts down:
// the gate closes first, then the engine and the store, and this
// coordinator campaigns again.

const (
	// campaignRetry is the pause after a failed campaign (etcd
	// unreachable, say) before the next.
	campaignRetry = 500 * time.Millisecond
	// leaseGrantTimeout bounds the grant of an election lease.
	leaseGrantTimeout = 5 * time.Second
	// termCheckInterval is how often a leader checks that its engine can
	// still commit; a refused (fenced) commit ends the term within it.
	termCheckInterval = 50 * time.Millisecond
)

// Election is this coordinator's part in the election of its group's
// leader. Its terms won open the gate (Gate.Lead); the leader it observes
// the gate names to the clients (Gate.Follow).
type Election struct {
	Etcd *clientv3.Client
	// Prefix is the store's prefix: the election is under Prefix/leader,
	// the leaders' status pages under Prefix/pages/.
	Prefix string
	// Endpoints are etcd's, named in the error of a grant not answered.
	Endpoints []string
	// TTL is the election lease's, in whole seconds.
	TTL  time.Duration
	Gate *Gate
	Log  *slog.Logger
	// Page is this coordinator's status page URL, published under its
	// election lease; "" when it serves none others can reach.
	Page string
	// LeaderPage is told the status page URL the leader published ("": it
	// published none), nil when no leader is known.
	LeaderPage func(page *string)
	// Load builds a term's engine over the store fenced by its election
	// key, loading every run as a restart does.
	Load func(ctx context.Context, st store.Store) (*engine.Engine, error)
	// OnCommit is the etcd store's commit hook (etcdstore.Options).
	OnCommit func(batches int, d time.Duration)
}

// key is the election's prefix under the store's.
func (e *Election) key() string { return e.Prefix + "/leader" }

// Start campaigns, in the background until stop, for the leadership of
// the group, serving each term won; self is the address the others name as
// the leader's meanwhile.
func (e *Election) Start(self string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := e.campaign(ctx, self); err != nil && ctx.Err() == nil {
				e.Log.Warn("election: campaign failed; retrying", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(campaignRetry):
				}
			}
		}
	}()
	return func() {
		cancel()
		select {
		case <-done:
		case <-time.After(e.TTL):
			// A campaign cut short resigns with the client's own context
			// (concurrency.Election.Campaign), and a term's end may wait
			// on etcd too: with etcd unreachable only closing the client
			// ends them. (Its own release, later, closes it again.)
			_ = e.Etcd.Close()
			<-done
		}
	}
}

// campaign is one election session: it follows until it wins, then leads
// until the term ends. Closing the session revokes its lease, so that a
// coordinator stepping down (or shutting down) hands over at once.
func (e *Election) campaign(ctx context.Context, self string) error {
	hold := newLeaseHold(e.Etcd, e.TTL)
	lease, err := e.grantLease(ctx, hold)
	if err != nil {
		return err
	}
	// The session outlives ctx just long enough for Close to revoke the
	// lease, which it gives the TTL at most.
	sessCtx, endSess := context.WithCancel(context.WithoutCancel(ctx))
	defer endSess()
	sess, err := concurrency.NewSession(e.Etcd, concurrency.WithLease(lease),
		concurrency.WithTTL(int(e.TTL/time.Second)), concurrency.WithContext(sessCtx))
	if err != nil {
		return fmt.Errorf("election session: %w", err)
	}
	defer func() { _ = sess.Close() }()
	// Whatever happens, nothing of this session is waited for once its
	// lease is gone or ctx ends.
	live, stop := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop(nil)
		wg.Wait()
	}()
	wg.Go(func() {
		select {
		case <-sess.Done():
			// The etcd client gives up on a lease it could not renew for
			// its TTL, as while etcd has no quorum; etcd expires none
			// then, and once quorum is back the lease lives on. Asked
			// directly, a lease still alive keeps the term (hold renews
			// it from now on), rather than a failover after the outage.
			if !e.sessionOutlived(live, hold) {
				stop(errLeaseLost)
			}
		case <-live.Done():
		}
	})
	hold.lease, hold.lost = lease, func() { stop(errLeaseLost) }
	wg.Go(func() { hold.keep(live) })
	if err := e.publishPage(live, lease); err != nil {
		return err
	}
	el := concurrency.NewElection(sess, e.key())
	wg.Go(func() { e.observe(live) })
	if err := el.Campaign(live, self); err != nil {
		return fmt.Errorf("campaign: %w", err)
	}
	return e.lead(live, el, self, hold)
}

// sessionOutlived reports whether the election lease is alive after its
// session's keep-alive ended, asking etcd for up to a TTL. Only a renewal
// sent from now on counts: the hold's own, answered just before etcd lost
// its quorum, would otherwise keep a term through an outage that it knew
// nothing of, and with it calls waiting for commits that cannot come.
func (e *Election) sessionOutlived(ctx context.Context, hold *leaseHold) bool {
	ctx, cancel := context.WithTimeout(ctx, e.TTL)
	defer cancel()
	if !hold.Reconfirm(ctx) {
		return false
	}
	e.Log.Info("election session: the etcd client gave up renewing the lease, which lives; renewing it directly")
	return true
}

// grantLease grants the election session's lease. It is granted here
// rather than by NewSession, whose context also keeps the lease alive: the
// grant must end at shutdown and give up on an etcd it cannot reach (or
// that refuses its certificate), so that the failure is logged instead of
// waited for silently.
func (e *Election) grantLease(ctx context.Context, hold *leaseHold) (clientv3.LeaseID, error) {
	ctx, cancel := context.WithTimeout(ctx, leaseGrantTimeout)
	defer cancel()
	sent := time.Now()
	lease, err := e.Etcd.Grant(ctx, int64(e.TTL/time.Second))
	if errors.Is(err, context.DeadlineExceeded) {
		// The client retries silently: say what usually causes it.
		return 0, fmt.Errorf("election lease: no answer from etcd at %s within %v (unreachable, or refusing this coordinator's TLS settings): %w",
			strings.Join(e.Endpoints, ","), leaseGrantTimeout, err)
	}
	if err != nil {
		return 0, fmt.Errorf("election lease: %w", err)
	}
	hold.renewed(sent, time.Duration(lease.TTL)*time.Second)
	return lease.ID, nil
}

// observe tells the gate and the status page who leads as it changes: the
// first-created key under the election prefix, its value the leader's
// gRPC address and its lease naming its page (see publishPage), or nobody
// between one leader's key vanishing and the next one's appearing, which
// etcd's Election.Observe leaves unsaid (followers would name a dead
// leader through the whole election).
func (e *Election) observe(ctx context.Context) {
	prefix := e.key() + "/"
	seen := int64(-1) // the leader key's creation revision; 0: none
	for ctx.Err() == nil {
		resp, err := e.Etcd.Get(ctx, prefix, clientv3.WithFirstCreate()...)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(campaignRetry):
			}
			continue
		}
		var first *mvccpb.KeyValue
		if len(resp.Kvs) > 0 {
			first = resp.Kvs[0]
		}
		// Another candidate's key changes nothing.
		if rev := first.GetCreateRevision(); rev != seen {
			e.follow(ctx, first)
			seen = rev
		}
		e.awaitChange(ctx, prefix, resp.Header.Revision+1)
	}
}

// awaitChange returns at the first change under prefix from revision rev
// on (or when the watch fails or ctx ends).
func (e *Election) awaitChange(ctx context.Context, prefix string, rev int64) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range e.Etcd.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if wr.Err() != nil || len(wr.Events) > 0 {
			return
		}
	}
}

// follow records the leader named by its election key kv (nil: none).
func (e *Election) follow(ctx context.Context, kv *mvccpb.KeyValue) {
	if kv == nil {
		e.Gate.Follow("")
		e.LeaderPage(nil)
		e.Log.Info("no leader: electing one")
		return
	}
	addr, page := string(kv.Value), ""
	if resp, err := e.Etcd.Get(ctx, e.pageKey(clientv3.LeaseID(kv.Lease))); err == nil && len(resp.Kvs) > 0 {
		page = string(resp.Kvs[0].Value)
	}
	e.Gate.Follow(addr)
	e.LeaderPage(&page)
	e.Log.Info("leader observed", "leader", addr, "status_page", page)
}

// pageKey is where the coordinator of an election lease publishes its
// status page's URL, beside (not in) its election value, which older
// coordinators read as the gRPC address alone.
func (e *Election) pageKey(lease clientv3.LeaseID) string {
	return fmt.Sprintf("%s/pages/%x", e.Prefix, int64(lease))
}

// publishPage puts this coordinator's status page URL under its election
// lease, so that it goes with the lease; nothing when it has none.
func (e *Election) publishPage(ctx context.Context, lease clientv3.LeaseID) error {
	if e.Page == "" {
		return nil
	}
	if _, err := e.Etcd.Put(ctx, e.pageKey(lease), e.Page, clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("publish the status page address: %w", err)
	}
	return nil
}

// lead serves one term: it opens the store fenced by this term's election
// key, loads the engine as a restart does (which re-arms the leases, the
// timers and the restart grace), opens the gate, and waits for the term to
// end; then it closes the gate, the engine and the store (campaign then
// closes the session, which resigns). ctx ends when the session's lease is
// lost or the coordinator shuts down; hold tells the gate whether the
// lease still lives (see leaseHold).
func (e *Election) lead(ctx context.Context, el *concurrency.Election, self string, hold Hold) error {
	fence := etcdstore.Fence{Key: el.Key(), Revision: el.Rev()}
	st, err := etcdstore.Open(ctx, e.Etcd, e.Prefix, fence, etcdstore.Options{OnCommit: e.OnCommit})
	if err != nil {
		return fmt.Errorf("open the etcd store: %w", err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			e.Log.Warn("closing the etcd store", "err", err)
		}
	}()
	eng, err := e.Load(ctx, st)
	if err != nil {
		return fmt.Errorf("load state from etcd: %w", err)
	}
	e.Gate.Lead(eng, self, hold)
	e.Log.Info("leading", "addr", self, "election_key", fence.Key, "revision", fence.Revision)
	cause := e.serveTerm(ctx, eng)
	e.Gate.StepDown()
	eng.Close()
	if errors.Is(cause, context.Canceled) {
		e.Log.Info("stepped down", "cause", "shutting down")
	} else {
		e.Log.Warn("stepped down", "cause", cause)
	}
	return nil
}

// errLeaseLost ends a term whose election session expired: another
// coordinator may lead already.
var errLeaseLost = errors.New("election session lost (lease expired or revoked)")

// serveTerm waits for the end of a term and returns its cause:
// errLeaseLost, the engine's failure (a refused commit among them), or
// ctx's end at shutdown.
func (e *Election) serveTerm(ctx context.Context, eng interface{ Healthy() error }) error {
	tick := time.NewTicker(termCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
			if err := eng.Healthy(); err != nil {
				return err
			}
		}
	}
}
