package client_test

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/fakefollower"
)

// freeAddr is a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// A client given several addresses works through the one that leads: a
// dead address and a follower (the stand-in of internal/testkit/fakefollower, until
// the HA coordinator is merged) are passed over. Health checking keeps
// calls away from the follower altogether.
func TestSeveralAddressesReachTheLeader(t *testing.T) {
	for _, tc := range []struct {
		name   string
		first  func(t *testing.T, leader string) string
		unused func() int64 // calls the first address got, when it can tell
	}{
		{name: "dead, live", first: func(t *testing.T, _ string) string { return freeAddr(t) }},
		{name: "follower, leader"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			co := startCoordinator(t)
			var f *fakefollower.Follower
			first := ""
			if tc.first != nil {
				first = tc.first(t, co.addr)
			} else {
				f = fakefollower.Start(t, fakefollower.Options{Leader: co.addr})
				first = f.Addr()
			}
			list := first + "," + co.addr
			admin := dialList(t, list, "")
			created, err := admin.Runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "r1", Spec: turnSpec(1)})
			if err != nil {
				t.Fatalf("CreateRun: %v", err)
			}
			w := startEnvWorker(t, dialList(t, list, created.GetRunToken()), "r1", false)
			saveAtDeadline(t, admin, "r1", w)
			if f != nil && f.Calls() != 0 {
				t.Errorf("the follower got %d calls; health checking should have kept them all on the leader", f.Calls())
			}
		})
	}
}

// A follower that still reports SERVING (a deposed leader that has not
// noticed yet) refuses calls with NOT_LEADER: the client makes them again,
// even those it never retries otherwise (ReissueRunToken), since the
// follower did nothing, and at the leader, passing the follower over
// though its health says SERVING. Alone in the list, it fails after the
// policy's attempts, and the error names the leader.
func TestCallsRefusedAsNotLeaderAreRetried(t *testing.T) {
	co := startCoordinator(t)
	f := fakefollower.Start(t, fakefollower.Options{Leader: co.addr, Serving: true})
	// The client sends its calls to the coordinator whose health turned
	// SERVING last: the follower in about every other new client.
	var admin *client.Client
	for i := 0; f.Calls() == 0; i++ {
		if i == 50 {
			t.Fatal("50 clients created runs and reissued their tokens, and none of the calls reached the follower")
		}
		admin = dialList(t, f.Addr()+","+co.addr, "")
		id := fmt.Sprintf("r%d", i)
		if _, err := admin.Runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: id, Spec: turnSpec(1)}); err != nil {
			t.Fatalf("CreateRun(%s): %v", id, err)
		}
		if _, err := admin.Runs.ReissueRunToken(t.Context(), &v1.ReissueRunTokenRequest{RunId: id}); err != nil {
			t.Fatalf("ReissueRunToken(%s): %v", id, err)
		}
	}
	before := f.Calls()
	for range 5 {
		if _, err := admin.Runs.ListRuns(t.Context(), &v1.ListRunsRequest{}); err != nil {
			t.Fatalf("ListRuns: %v", err)
		}
	}
	if got := f.Calls() - before; got != 0 {
		t.Errorf("after its refusal the follower got %d more calls of 5, want it passed over", got)
	}

	alone := dialList(t, f.Addr(), "", client.WithRetry(client.RetryPolicy{MaxAttempts: 3, Base: time.Millisecond, Max: time.Millisecond}))
	before = f.Calls()
	_, err := alone.Runs.ReissueRunToken(t.Context(), &v1.ReissueRunTokenRequest{RunId: "r0"})
	leader, ok := client.NotLeader(err)
	if status.Code(err) != codes.Unavailable || !ok || leader != co.addr {
		t.Fatalf("ReissueRunToken on a follower alone: %v (NotLeader %q, %v); want UNAVAILABLE naming the leader %s", err, leader, ok, co.addr)
	}
	if got := f.Calls() - before; got != 3 {
		t.Errorf("the follower got %d attempts, want the policy's 3", got)
	}
	if _, ok := client.NotLeader(errors.New("other")); ok {
		t.Error("NotLeader matches an error that is no follower's refusal")
	}
}

// A call that finds no coordinator leading among several says so in words,
// not in grpc-go's ("pickfirst: health check failure: connection active
// but health check failed. status=NOT_SERVING").
func TestNoLeaderIsSaidInWords(t *testing.T) {
	f1 := fakefollower.Start(t, fakefollower.Options{})
	f2 := fakefollower.Start(t, fakefollower.Options{})
	cl := dialList(t, f1.Addr()+","+f2.Addr(), "", client.WithRetry(client.RetryPolicy{MaxAttempts: 3, Base: 10 * time.Millisecond}))
	_, err := cl.Runs.ListRuns(t.Context(), &v1.ListRunsRequest{})
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.Unavailable || !strings.Contains(msg, "no coordinator leads at the moment") || strings.Contains(msg, "pickfirst") {
		t.Fatalf("ListRuns with no leader: %v; want UNAVAILABLE saying no coordinator leads, in words", err)
	}
	if f1.Calls()+f2.Calls() != 0 {
		t.Errorf("the followers got %d calls", f1.Calls()+f2.Calls())
	}
}
