package coordinator_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/coordtest"
	"github.com/snapcoord/snapcoord/internal/testkit/etcdtest"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
)

// reasonOf is the snapcoord ErrorInfo reason of a call's error, or "".
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == "snapcoord.v1" {
			return info.GetReason()
		}
	}
	return ""
}

// wantOutcomeUnknown checks that err is UNAVAILABLE with reason
// OUTCOME_UNKNOWN: not NOT_LEADER, which says the call did nothing, nor a
// bare timeout.
func wantOutcomeUnknown(t *testing.T, what string, err error) {
	t.Helper()
	if status.Code(err) != codes.Unavailable || reasonOf(err) != "OUTCOME_UNKNOWN" {
		t.Fatalf("%s: %v (reason %q); want UNAVAILABLE OUTCOME_UNKNOWN", what, err, reasonOf(err))
	}
}

// loseQuorum pauses two of the three members (SIGSTOP, as frozen machines)
// and returns the function that resumes them.
func loseQuorum(t *testing.T, etcd *etcdtest.Cluster) (restore func()) {
	t.Helper()
	for _, i := range []int{1, 2} {
		if err := etcd.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	resumed := false
	restore = func() {
		if resumed {
			return
		}
		resumed = true
		for _, i := range []int{1, 2} {
			if err := etcd.Cont(i); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(restore)
	return restore
}

// etcd loses its quorum while a TriggerDeadline waits for its commit, and
// the call's deadline passes first. The caller hears UNAVAILABLE
// OUTCOME_UNKNOWN before its own deadline (not NOT_LEADER, which would say
// nothing was done, nor its own DEADLINE_EXCEEDED); once quorum is back the
// trigger has taken effect, and the same trigger again answers OK with the
// fire the first attempt made, not "already fired".
func TestEtcdQuorumLossDuringTriggerIsAnsweredOutcomeUnknown(t *testing.T) {
	etcd := etcdtest.Start(t, 3)
	cfg := etcdConfig(t, etcd.Endpoints())
	// The leader keeps its session through the outage: this is about the
	// caller's deadline, not a step-down (see the CreateRun test below).
	cfg.ElectionTTL = time.Minute
	leader := coordtest.Serve(t, cfg)
	t.Cleanup(leader.Stop)
	awaitRunService(t, leader.Addr(), healthpb.HealthCheckResponse_SERVING)
	runs := v1.NewRunServiceClient(dial(t, leader.Addr()))
	if _, err := runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "r", Spec: spectest.Checkpointed(1, "00:01:00:00")}); err != nil {
		t.Fatal(err)
	}

	restore := loseQuorum(t, etcd)
	// The coordinator answers a tenth of the call's time (here 1 s) before
	// its deadline: room for the answer to arrive on a loaded machine.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	trigger := &v1.TriggerDeadlineRequest{RunId: "r", Reason: "node drain"}
	began := time.Now()
	_, err := runs.TriggerDeadline(ctx, trigger)
	wantOutcomeUnknown(t, "TriggerDeadline during a quorum loss", err)
	t.Logf("answered after %v: %v", time.Since(began).Round(time.Millisecond), err)
	restore()

	// Generous bounds: the store's transaction is retried as etcd elects
	// a leader again.
	ctx, cancel = context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	again, err := runs.TriggerDeadline(ctx, trigger)
	if err != nil {
		t.Fatalf("the same trigger once quorum is back: %v; want OK", err)
	}
	got, err := runs.GetRun(ctx, &v1.GetRunRequest{RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	fired := got.GetRun().GetFiredAt()
	if fired == nil || got.GetRun().GetFireKind() != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_MANUAL {
		t.Fatalf("once quorum is back the run is %v; want the deadline fired by the trigger", got.GetRun())
	}
	if !again.GetRun().GetFiredAt().AsTime().Equal(fired.AsTime()) {
		t.Fatalf("the repeat answered a fire at %v; the run fired at %v", again.GetRun().GetFiredAt().AsTime(), fired.AsTime())
	}
	_, err = runs.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: "r", Reason: "another cause"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a trigger with another reason after the fire: %v; want FAILED_PRECONDITION", err)
	}
}

// The "NOT_LEADER but stored" CreateRun: etcd loses its quorum while a
// CreateRun waits for its commit, the leader's session lapses and it steps
// down, cancelling the call; the store still retries the transaction, which
// lands when quorum returns unless the fence refuses it first. That call
// used to be answered NOT_LEADER ("did nothing") and the run was there
// afterwards. It is answered OUTCOME_UNKNOWN, and a repeat then returns the
// run (with a new token if the first attempt's landed). NOT_LEADER remains
// the answer of a commit the fence refused, which certainly did not apply
// (TestEtcdDeposedLeaderIsFenced).
func TestEtcdCreateRunOfLeaderLostMidCommitIsAnsweredOutcomeUnknown(t *testing.T) {
	etcd := etcdtest.Start(t, 3)
	log := logsink.NewWatcher()
	cfg := etcdConfig(t, etcd.Endpoints())
	cfg.Logger = slog.New(slog.NewJSONHandler(log, nil))
	leader := coordtest.Serve(t, cfg)
	t.Cleanup(leader.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(log.String())
		}
	})
	awaitRunService(t, leader.Addr(), healthpb.HealthCheckResponse_SERVING)
	runs := v1.NewRunServiceClient(dial(t, leader.Addr()))
	create := &v1.CreateRunRequest{RunId: "maybe", Spec: spectest.Checkpointed(1, "00:01:00:00")}

	restore := loseQuorum(t, etcd)
	// Far longer than the election TTL: the step-down answers it.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	began := time.Now()
	_, err := runs.CreateRun(ctx, create)
	wantOutcomeUnknown(t, "CreateRun whose leader stepped down while its commit waited", err)
	t.Logf("answered %v into the quorum loss (election TTL %v): %v", time.Since(began).Round(time.Millisecond), testTTL, err)
	restore()

	awaitRunService(t, leader.Addr(), healthpb.HealthCheckResponse_SERVING)
	_, err = runs.GetRun(ctx, &v1.GetRunRequest{RunId: "maybe"})
	landed := err == nil
	if !landed && status.Code(err) != codes.NotFound {
		t.Fatalf("GetRun once a leader serves again: %v", err)
	}
	t.Logf("the first attempt's commit landed: %v", landed)
	again, err := runs.CreateRun(ctx, create)
	if err != nil || again.GetRun().GetRunId() != "maybe" || again.GetRunToken() == "" || again.GetTokenReissued() != landed {
		t.Fatalf("CreateRun repeated: %v (token reissued %v); want the run with a token, reissued iff the first attempt landed (%v)",
			err, again.GetTokenReissued(), landed)
	}
}
