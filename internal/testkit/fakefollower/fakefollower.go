// Package fakefollower is a stand-in, for tests, for a coordinator that is
// not the leader among coordinators sharing an etcd prefix: its gRPC health
// reports NOT_SERVING for RunService and WorkerService ("" SERVING: the
// process is fine), and it answers every call of those services with
// UNAVAILABLE, "not the leader; the leader is at <leader>", and the
// google.rpc.ErrorInfo {Reason: NOT_LEADER, Domain: snapcoord.v1,
// Metadata: {leader: <leader>}}, as a real follower does. It lets the
// clients' tests cover a [follower, leader] address list without an etcd
// cluster.
package fakefollower

import (
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Follower is a running stand-in.
type Follower struct {
	addr  string
	calls atomic.Int64
}

// Options shape a stand-in.
type Options struct {
	// Leader is the address its refusals name; "" when it knows none.
	Leader string
	// Serving makes its health report SERVING for both services though it
	// refuses their calls: a deposed leader that has not yet noticed, the
	// window a client must ride out by retrying.
	Serving bool
}

// Start serves a stand-in on a free loopback port until the test ends.
func Start(t testing.TB, opts Options) *Follower {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &Follower{addr: lis.Addr().String()}
	msg := "not the leader; the leader is at " + opts.Leader
	if opts.Leader == "" {
		msg = "not the leader; no leader is known"
	}
	st, err := status.New(codes.Unavailable, msg).WithDetails(&errdetails.ErrorInfo{
		Reason: "NOT_LEADER", Domain: "snapcoord.v1", Metadata: map[string]string{"leader": opts.Leader}})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		f.calls.Add(1)
		return st.Err()
	}))
	hs := health.NewServer()
	want := healthpb.HealthCheckResponse_NOT_SERVING
	if opts.Serving {
		want = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range []string{v1.RunService_ServiceDesc.ServiceName, v1.WorkerService_ServiceDesc.ServiceName} {
		hs.SetServingStatus(svc, want)
	}
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return f
}

// Addr is where it listens.
func (f *Follower) Addr() string { return f.addr }

// Calls counts the RunService and WorkerService calls it refused.
func (f *Follower) Calls() int64 { return f.calls.Load() }
