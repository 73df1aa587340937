package coordinator_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/coordinator"
	"github.com/snapcoord/snapcoord/coordinator/coordtest"
	"github.com/snapcoord/snapcoord/internal/etcdtest"
	"github.com/snapcoord/snapcoord/internal/logsink"
	"github.com/snapcoord/snapcoord/internal/spectest"
)

// etcdConfig is coordtest's configuration on the etcd store at endpoints,
// with the status page on a free loopback port.
func etcdConfig(t *testing.T, endpoints []string) coordinator.Config {
	cfg := coordtest.Config(t.TempDir())
	cfg.Store = coordinator.StoreEtcd
	cfg.Etcd.Endpoints = endpoints
	cfg.Etcd.Prefix = "/coordinator-test"
	cfg.ElectionTTL = 2 * time.Second
	cfg.MetricsListen = "127.0.0.1:0"
	return cfg
}

// awaitRunService returns once addr's RunService health is want.
func awaitRunService(t *testing.T, addr string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := healthpb.NewHealthClient(dial(t, addr)).Watch(ctx, &healthpb.HealthCheckRequest{Service: "snapcoord.v1.RunService"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("RunService health of %s never %v: %v", addr, want, err)
		}
		if resp.GetStatus() == want {
			return
		}
	}
}

// Two in-process coordinators on one prefix: one leads, the other follows
// and says where the leader is on its status page. Shut down, the leader
// resigns, and the follower takes over at once (not after the TTL), with
// the run the first leader created.
func TestEtcdLeaderHandsOverOnShutdown(t *testing.T) {
	etcd := etcdtest.Start(t, 3)
	first := coordtest.Serve(t, etcdConfig(t, etcd.Endpoints()))
	t.Cleanup(first.Stop)
	awaitRunService(t, first.Addr(), healthpb.HealthCheckResponse_SERVING)
	log := logsink.NewWatcher()
	observed := log.Next("leader observed", "")
	cfg := etcdConfig(t, etcd.Endpoints())
	cfg.Logger = slog.New(slog.NewJSONHandler(log, nil))
	second := coordtest.Start(t, cfg)
	if addr, self := first.Leader(); !self || addr != first.Addr() {
		t.Fatalf("first: Leader() = %q, %v; want itself", addr, self)
	}
	if second.Engine() != nil {
		t.Fatal("the follower has an engine")
	}
	if _, err := v1.NewRunServiceClient(dial(t, first.Addr())).CreateRun(t.Context(),
		&v1.CreateRunRequest{RunId: "kept", Spec: spectest.Checkpointed(1, "00:01:00:00")}); err != nil {
		t.Fatalf("CreateRun on the leader: %v", err)
	}
	<-observed
	if page := statusPage(t, second.MetricsAddr()); !strings.Contains(page, "this coordinator follows; the leader is at "+first.Addr()) {
		t.Errorf("the follower's status page does not name the leader %s:\n%s", first.Addr(), page)
	}
	if addr, self := second.Leader(); self || addr != first.Addr() {
		t.Fatalf("second: Leader() = %q, %v; want %s, not itself", addr, self, first.Addr())
	}

	stopped := time.Now()
	first.Stop()
	awaitRunService(t, second.Addr(), healthpb.HealthCheckResponse_SERVING)
	handover := time.Since(stopped)
	t.Logf("graceful handover: %v (election TTL 2s)", handover.Round(time.Millisecond))
	if handover >= 2*time.Second {
		t.Errorf("handover took %v: the leader did not resign, the follower waited for its lease", handover)
	}
	got, err := v1.NewRunServiceClient(dial(t, second.Addr())).GetRun(t.Context(), &v1.GetRunRequest{RunId: "kept"})
	if err != nil || got.GetRun().GetRunId() != "kept" {
		t.Fatalf("GetRun on the new leader = %v, %v; want the run", got.GetRun(), err)
	}
}

// A leader that does not know it was deposed (its election key is gone,
// as after a partition; its session still looks alive to it) cannot
// write: its next commit is refused by the fence, the call is answered
// NOT_LEADER, the run it tried to create is nowhere, and it steps down.
func TestEtcdDeposedLeaderIsFenced(t *testing.T) {
	etcd := etcdtest.Start(t, 3)
	log := logsink.NewWatcher()
	cfg := etcdConfig(t, etcd.Endpoints())
	cfg.Logger = slog.New(slog.NewJSONHandler(log, nil))
	first := coordtest.Start(t, cfg)
	awaitRunService(t, first.Addr(), healthpb.HealthCheckResponse_SERVING)
	second := coordtest.Start(t, etcdConfig(t, etcd.Endpoints()))
	runs := v1.NewRunServiceClient(dial(t, first.Addr()))
	if _, err := runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "before", Spec: spectest.Checkpointed(1, "00:01:00:00")}); err != nil {
		t.Fatalf("CreateRun on the leader: %v", err)
	}

	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	keys, err := cli.Get(t.Context(), cfg.Etcd.Prefix+"/leader/", clientv3.WithFirstCreate()...)
	if err != nil || len(keys.Kvs) != 1 || string(keys.Kvs[0].Value) != first.Addr() {
		t.Fatalf("leader key: %v, %v; want the first coordinator's", keys, err)
	}
	steppedDown := log.Next("stepped down", "")
	if _, err := cli.Delete(t.Context(), string(keys.Kvs[0].Key)); err != nil {
		t.Fatal(err)
	}
	awaitRunService(t, second.Addr(), healthpb.HealthCheckResponse_SERVING)

	_, err = runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "ghost", Spec: spectest.Checkpointed(1, "00:01:00:00")})
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.HasPrefix(st.Message(), "not the leader") {
		t.Fatalf("CreateRun on the deposed leader: %v; want UNAVAILABLE NOT_LEADER", err)
	}
	<-steppedDown
	if !strings.Contains(log.String(), "fenced") {
		t.Errorf("the deposed leader stepped down for another cause than a fenced commit:\n%s", log.String())
	}
	next := v1.NewRunServiceClient(dial(t, second.Addr()))
	if _, err := next.GetRun(t.Context(), &v1.GetRunRequest{RunId: "ghost"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetRun(ghost) on the new leader: %v; want NOT_FOUND", err)
	}
	if _, err := next.GetRun(t.Context(), &v1.GetRunRequest{RunId: "before"}); err != nil {
		t.Fatalf("GetRun(before) on the new leader: %v", err)
	}
	awaitRunService(t, first.Addr(), healthpb.HealthCheckResponse_NOT_SERVING)
}

func statusPage(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// With etcd gone for good, a leader steps down once its lease can no
// longer be renewed, and both it and a follower still shut down promptly:
// nothing waits for etcd beyond its bounds.
func TestEtcdGoneLeaderStepsDownAndShutdownEnds(t *testing.T) {
	etcd := etcdtest.Start(t, 3)
	log := logsink.NewWatcher()
	cfg := etcdConfig(t, etcd.Endpoints())
	cfg.Logger = slog.New(slog.NewJSONHandler(log, nil))
	leader := coordtest.Serve(t, cfg)
	t.Cleanup(leader.Stop)
	awaitRunService(t, leader.Addr(), healthpb.HealthCheckResponse_SERVING)
	follower := coordtest.Serve(t, etcdConfig(t, etcd.Endpoints()))
	t.Cleanup(follower.Stop)

	steppedDown := log.Next("stepped down", "")
	for i := range 3 {
		if err := etcd.Kill(i); err != nil {
			t.Fatal(err)
		}
	}
	gone := time.Now()
	<-steppedDown
	t.Logf("leader stepped down %v after etcd was killed (election TTL 2s)", time.Since(gone).Round(time.Millisecond))
	awaitRunService(t, leader.Addr(), healthpb.HealthCheckResponse_NOT_SERVING)

	for _, in := range []*coordtest.Instance{leader, follower} {
		began := time.Now()
		in.Stop()
		if took := time.Since(began); took > 5*time.Second {
			t.Errorf("shutdown with etcd gone took %v", took)
		}
	}
}
