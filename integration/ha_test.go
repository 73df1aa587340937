package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordproc"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
)

// haTTL is the coordinators' election TTL in these tests: short, so that
// a failover takes seconds, and long enough that a loaded CI machine does
// not depose a healthy leader (it renews every third of it).
const haTTL = 3 * time.Second

const runService = "snapcoord.v1.RunService"

// startGroup runs n snapcoord binaries on one prefix of a real 3-member
// etcd cluster.
func startGroup(t *testing.T, n int) []*coordproc.Proc {
	t.Helper()
	_, procs := startEtcdGroup(t, n, "--heartbeat-interval", "5s", "--lease-ttl", "5m")
	return procs
}

// startEtcdGroup is startGroup with the coordinators' extra args, and the
// etcd cluster.
func startEtcdGroup(t *testing.T, n int, args ...string) (*etcdtest.Cluster, []*coordproc.Proc) {
	t.Helper()
	etcd := etcdtest.Start(t, 3)
	procs := make([]*coordproc.Proc, n)
	for i := range procs {
		procs[i] = coordproc.ForTest(t, coordproc.Config{Bin: binPath,
			LogPath: filepath.Join(t.TempDir(), fmt.Sprintf("snapcoord-%d.log", i)),
			Etcd:    coordproc.Etcd{Endpoints: etcd.Endpoints(), Prefix: "/ha", ElectionTTL: haTTL},
			Args:    append([]string{"--metrics-listen", "", "--log-format", "json"}, args...)})
	}
	return etcd, procs
}

// awaitLeader returns the one of procs (those not excluded) whose
// RunService health turns SERVING first, watching them all, and checks
// that every other reports NOT_SERVING for RunService while "" SERVING.
func awaitLeader(ctx context.Context, t *testing.T, procs []*coordproc.Proc, exclude ...*coordproc.Proc) *coordproc.Proc {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	won := make(chan *coordproc.Proc, len(procs))
	candidates := 0
	for _, p := range procs {
		if excluded(p, exclude) {
			continue
		}
		candidates++
		go func() {
			if p.AwaitHealth(ctx, runService, healthpb.HealthCheckResponse_SERVING) == nil {
				won <- p
			}
		}()
	}
	var leader *coordproc.Proc
	select {
	case leader = <-won:
	case <-ctx.Done():
		t.Fatalf("no leader among %d coordinators: %v", candidates, ctx.Err())
	}
	for _, p := range procs {
		if p == leader || excluded(p, exclude) {
			continue
		}
		if st, err := p.Health(ctx, runService); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("follower %s: RunService health %v, %v; want NOT_SERVING (two leaders?)", p.Addr, st, err)
		}
		if st, err := p.Health(ctx, ""); err != nil || st != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("follower %s: health %v, %v; want SERVING", p.Addr, st, err)
		}
	}
	return leader
}

func excluded(p *coordproc.Proc, exclude []*coordproc.Proc) bool {
	for _, q := range exclude {
		if p == q {
			return true
		}
	}
	return false
}

// notLeader returns the leader address of a NOT_LEADER answer, failing t
// for any other answer.
func notLeader(t *testing.T, what string, err error) string {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		t.Fatalf("%s: %v; want UNAVAILABLE NOT_LEADER", what, err)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "NOT_LEADER" && info.GetDomain() == "snapcoord.v1" {
			leader := info.GetMetadata()["leader"]
			if st.Message() != "not the leader; the leader is at "+leader {
				t.Errorf("%s: message %q does not name the leader %q", what, st.Message(), leader)
			}
			return leader
		}
	}
	t.Fatalf("%s: %v carries no NOT_LEADER ErrorInfo", what, err)
	return ""
}

// outcomeUnknown reports whether err is UNAVAILABLE OUTCOME_UNKNOWN: the
// call's change may or may not have taken effect.
func outcomeUnknown(err error) bool {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "OUTCOME_UNKNOWN" && info.GetDomain() == "snapcoord.v1" {
			return status.Code(err) == codes.Unavailable
		}
	}
	return false
}

// awaitNamedLeader calls a follower until its NOT_LEADER answer names
// want: a follower learns the new leader from etcd a moment after the
// leader itself knows.
func awaitNamedLeader(ctx context.Context, t *testing.T, follower *coordproc.Proc, want string) {
	t.Helper()
	runs := newCluster(t, follower.Addr).runs
	for {
		_, err := runs.ListRuns(ctx, &v1.ListRunsRequest{})
		if got := notLeader(t, "ListRuns on follower "+follower.Addr, err); got == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("follower %s never named the leader %s", follower.Addr, want)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// on is r with its clients connected to another coordinator.
func (r *run) on(c *cluster) *run {
	return &run{c: c, id: r.id, tok: r.tok, ws: v1.NewWorkerServiceClient(dial(c.t, c.addr, r.tok))}
}

// Three coordinators on one etcd prefix elect exactly one leader; the
// others answer NOT_LEADER naming it. SIGKILL the leader: another takes
// over and serves the same runs, with the decision already given the same.
func TestHAFailoverAfterLeaderKill(t *testing.T) {
	ctx := testContext(t)
	procs := startGroup(t, 3)
	lead := awaitLeader(ctx, t, procs)
	for _, p := range procs {
		if p != lead {
			awaitNamedLeader(ctx, t, p, lead.Addr)
		}
	}

	r := newCluster(t, lead.Addr).createRun(ctx, "ha", deadlineSpec(2, time.Now().Add(time.Hour), false))
	ranks := r.trainers(ctx, 2)
	r.stepAll(ctx, ranks, 1, shortIteration)
	decided := r.stepAll(ctx, ranks, 2, shortIteration)
	// A follower's WorkerService refuses the run's own token with NOT_LEADER
	// too (not UNAUTHENTICATED: it has no engine to check the token with).
	for _, p := range procs {
		if p != lead {
			_, err := r.on(newCluster(t, p.Addr)).ws.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: r.id, WorkerId: ranks[0]})
			if got := notLeader(t, "Heartbeat on a follower", err); got != lead.Addr {
				t.Errorf("follower %s names %q as the leader, want %s", p.Addr, got, lead.Addr)
			}
		}
	}

	if err := lead.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	next := awaitLeader(ctx, t, procs, lead)
	failover := time.Since(killed)
	t.Logf("failover: leader SIGKILLed → %s SERVING in %v (election TTL %v)", next.Addr, failover.Round(time.Millisecond), haTTL)

	r2 := r.on(newCluster(t, next.Addr))
	if run := r2.get(ctx); run.LastStep != 2 || run.State != v1.RunState_RUN_STATE_RUNNING {
		t.Fatalf("after failover: last_step %d state %v; want 2 RUNNING", run.LastStep, run.State)
	}
	if d := r2.stepAll(ctx, ranks, 2, shortIteration); !protoEqual(d, decided) {
		t.Fatalf("step 2 after failover: %v; want the decision given before it: %v", d, decided)
	}
	if d := r2.stepAll(ctx, ranks, 3, shortIteration); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 3 on the new leader: %v, want CONTINUE", d.Action)
	}
	for _, p := range procs {
		if p != lead && p != next {
			awaitNamedLeader(ctx, t, p, next.Addr)
		}
	}
}

// A leader paused (SIGSTOP) for longer than its election TTL is replaced;
// resumed, it steps down: a call that reached it while it was paused is
// refused (the gate closed, or etcd refused its fenced commit), nothing it
// tried to write is visible on the new leader, and it follows.
func TestHAPausedLeaderIsFenced(t *testing.T) {
	ctx := testContext(t)
	procs := startGroup(t, 2)
	old := awaitLeader(ctx, t, procs)
	r := newCluster(t, old.Addr).createRun(ctx, "paused", deadlineSpec(1, time.Now().Add(time.Hour), false))
	rank := r.trainers(ctx, 1)[0]
	decided := r.step(ctx, rank, 1, shortIteration)
	oldRuns := newCluster(t, old.Addr).runs
	if _, err := oldRuns.ListRuns(ctx, &v1.ListRunsRequest{}); err != nil { // the connection is up
		t.Fatal(err)
	}

	if err := old.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	// Sent while it is paused: the kernel queues it, the process reads it
	// once resumed, after another coordinator took over.
	ghost := make(chan error, 1)
	go func() {
		_, err := oldRuns.CreateRun(ctx, &v1.CreateRunRequest{RunId: "ghost", Spec: deadlineSpec(1, time.Now().Add(time.Hour), false)})
		ghost <- err
	}()
	next := awaitLeader(ctx, t, procs, old)
	t.Logf("failover: leader SIGSTOPped → %s SERVING in %v (election TTL %v)", next.Addr, time.Since(paused).Round(time.Millisecond), haTTL)
	r2 := r.on(newCluster(t, next.Addr))
	if d := r2.step(ctx, rank, 1, shortIteration); !protoEqual(d, decided) {
		t.Fatalf("step 1 on the new leader: %v; want the decision given before: %v", d, decided)
	}
	if d := r2.step(ctx, rank, 2, shortIteration); d.Action != v1.StepAction_STEP_ACTION_CONTINUE {
		t.Fatalf("step 2 on the new leader: %v, want CONTINUE", d.Action)
	}

	if err := old.Resume(); err != nil {
		t.Fatal(err)
	}
	// NOT_LEADER, unless the call got into the term before the resumed
	// leader saw its session gone and was then cut off with its commit in
	// flight: OUTCOME_UNKNOWN, truthfully, though the fence refuses that
	// commit (checked below).
	if err := <-ghost; !outcomeUnknown(err) {
		notLeader(t, "CreateRun sent to the paused leader", err)
	}
	if err := old.AwaitHealth(ctx, runService, healthpb.HealthCheckResponse_NOT_SERVING); err != nil {
		t.Fatal(err)
	}
	awaitNamedLeader(ctx, t, old, next.Addr)
	i := strings.Index(old.Log(), `"msg":"stepped down"`)
	if i < 0 {
		t.Fatalf("the resumed leader did not log that it stepped down:\n%s", old.Tail(20))
	}
	// Which came first, its lapsed session or a commit the fence refused,
	// is a race; both end the term, and neither lets a write through.
	t.Logf("the resumed leader: %s", strings.SplitN(old.Log()[i:], "\n", 2)[0])
	_, err := r2.c.runs.GetRun(ctx, &v1.GetRunRequest{RunId: "ghost"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("GetRun(ghost) on the new leader: %v; want NOT_FOUND: the deposed leader's write is visible", err)
	}
	if run := r2.get(ctx); run.LastStep != 2 {
		t.Fatalf("after the old leader resumed: last_step %d, want 2", run.LastStep)
	}
}
