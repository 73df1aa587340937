package coordinator_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordtest"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
	"github.com/snapcoord/snapcoord/internal/testkit/testpki"
	"github.com/snapcoord/snapcoord/server/coordinator"
)

// testTTL is the election TTL of these tests: failovers take seconds, and
// a leader on a loaded machine keeps its lease (renewed every third of it).
const testTTL = 3 * time.Second

// etcdConfig is coordtest's configuration on the etcd store at endpoints,
// with the status page on a free loopback port.
func etcdConfig(t *testing.T, endpoints []string) coordinator.Config {
	cfg := coordtest.Config(t.TempDir())
	cfg.Store = coordinator.StoreEtcd
	cfg.Etcd.Endpoints = endpoints
	cfg.Etcd.Prefix = "/coordinator-test"
	cfg.ElectionTTL = testTTL
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
	// The follower's page sends people to the leader's page, at the
	// address the leader published for it (its metrics listener's here),
	// not to its gRPC address.
	if code, loc := redirect(t, "http://"+second.MetricsAddr()+"/runs/kept"); code != http.StatusTemporaryRedirect || loc != "http://"+first.MetricsAddr()+"/runs/kept" {
		t.Errorf("the follower's status page: %d to %q; want 307 to the leader's page http://%s/runs/kept", code, loc, first.MetricsAddr())
	}
	if addr, self := second.Leader(); self || addr != first.Addr() {
		t.Fatalf("second: Leader() = %q, %v; want %s, not itself", addr, self, first.Addr())
	}
	wantLeaderGauge(t, first.MetricsAddr(), 1)
	wantLeaderGauge(t, second.MetricsAddr(), 0)
	wantReflection(t, second.Addr())

	stopped := time.Now()
	first.Stop()
	awaitRunService(t, second.Addr(), healthpb.HealthCheckResponse_SERVING)
	handover := time.Since(stopped)
	t.Logf("graceful handover: %v (election TTL %v)", handover.Round(time.Millisecond), testTTL)
	if handover >= testTTL {
		t.Errorf("handover took %v: the leader did not resign, the follower waited for its lease", handover)
	}
	got, err := v1.NewRunServiceClient(dial(t, second.Addr())).GetRun(t.Context(), &v1.GetRunRequest{RunId: "kept"})
	if err != nil || got.GetRun().GetRunId() != "kept" {
		t.Fatalf("GetRun on the new leader = %v, %v; want the run", got.GetRun(), err)
	}
	wantLeaderGauge(t, second.MetricsAddr(), 1)
}

// wantReflection checks that server reflection at addr lists RunService:
// a follower's gate leaves reflection alone.
func wantReflection(t *testing.T, addr string) {
	t.Helper()
	refl, err := reflectionpb.NewServerReflectionClient(dial(t, addr)).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = refl.CloseSend() }()
	if err := refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := refl.Recv()
	if err != nil {
		t.Fatalf("reflection on a follower: %v", err)
	}
	for _, svc := range resp.GetListServicesResponse().GetService() {
		if svc.GetName() == "snapcoord.v1.RunService" {
			return
		}
	}
	t.Errorf("reflection on a follower lists %v, without snapcoord.v1.RunService", resp.GetListServicesResponse().GetService())
}

// wantLeaderGauge checks the snapcoord_leader gauge on a /metrics page.
func wantLeaderGauge(t *testing.T, metricsAddr string, want int) {
	t.Helper()
	page := get(t, "http://"+metricsAddr+"/metrics")
	if line := fmt.Sprintf("\nsnapcoord_leader %d\n", want); !strings.Contains(page, line) {
		t.Errorf("%s/metrics lacks %q", metricsAddr, strings.TrimSpace(line))
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
	// A watch open in the term, which its end must cut.
	watch, err := runs.WatchRun(t.Context(), &v1.WatchRunRequest{RunId: "before"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatalf("WatchRun: %v", err)
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
	for {
		_, err := watch.Recv()
		if err == nil {
			continue // the rest of the run's log
		}
		if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.HasPrefix(st.Message(), "not the leader") {
			t.Errorf("a watch open when the leader stepped down ended with %v; want UNAVAILABLE NOT_LEADER", err)
		}
		break
	}
	if !strings.Contains(log.String(), "fenced") {
		t.Errorf("the deposed leader stepped down for another cause than a fenced commit:\n%s", log.String())
	}
	// A routine step-down in a group: a warning, and no advice to restart.
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, "a commit was fenced") && !strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, "restart") {
			t.Errorf("the step-down logged %s", line)
		}
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

// redirect GETs url without following a redirect: the status code and
// Location.
func redirect(t *testing.T, url string) (int, string) {
	t.Helper()
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location")
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
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
	t.Logf("leader stepped down %v after etcd was killed (election TTL %v)", time.Since(gone).Round(time.Millisecond), testTTL)
	awaitRunService(t, leader.Addr(), healthpb.HealthCheckResponse_NOT_SERVING)

	for _, in := range []*coordtest.Instance{leader, follower} {
		began := time.Now()
		in.Stop()
		if took := time.Since(began); took > 5*time.Second {
			t.Errorf("shutdown with etcd gone took %v", took)
		}
	}
}

// The etcd TLS settings reach etcd: a coordinator with the CA and a client
// certificate leads a cluster that requires client certificates; one with
// the CA alone cannot even campaign.
func TestEtcdMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "etcd-ca")
	server := ca.Issue(t, dir, "etcd-server", x509.ExtKeyUsageServerAuth)
	client := ca.Issue(t, dir, "coordinator", x509.ExtKeyUsageClientAuth)
	etcd := etcdtest.StartTLS(t, 1, &etcdtest.TLS{CAFile: ca.File,
		ServerCertFile: server.CertFile, ServerKeyFile: server.KeyFile,
		ClientCertFile: client.CertFile, ClientKeyFile: client.KeyFile})

	cfg := etcdConfig(t, etcd.Endpoints())
	cfg.Etcd.CAFile, cfg.Etcd.CertFile, cfg.Etcd.KeyFile = ca.File, client.CertFile, client.KeyFile
	leader := coordtest.Start(t, cfg)
	awaitRunService(t, leader.Addr(), healthpb.HealthCheckResponse_SERVING)
	if _, err := v1.NewRunServiceClient(dial(t, leader.Addr())).CreateRun(t.Context(),
		&v1.CreateRunRequest{RunId: "over-tls", Spec: spectest.Checkpointed(1, "00:01:00:00")}); err != nil {
		t.Fatalf("CreateRun over etcd mutual TLS: %v", err)
	}

	log := logsink.NewWatcher()
	refused := log.Next("election: campaign failed; retrying", "")
	noCert := etcdConfig(t, etcd.Endpoints())
	noCert.Etcd.CAFile = ca.File
	noCert.Logger = slog.New(slog.NewJSONHandler(log, nil))
	coordtest.Start(t, noCert)
	<-refused
	if !strings.Contains(log.String(), "refusing this coordinator's TLS settings") {
		t.Errorf("the failed campaign's log does not say what may be wrong:\n%s", log.String())
	}
}
