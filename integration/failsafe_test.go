package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
)

// The fail-safe plan of client.Trainer against the snapcoord binary: two
// ranks, the coordinator SIGKILLed mid-run. W and P are shortened (1 s,
// 0.2 s) so that a run fits in seconds; both ranks use the same, as every
// rank of a run must.
var testFailSafe = client.FailSafeConfig{Wait: time.Second, Probe: 200 * time.Millisecond}

// Each iteration the ranks report, and I therefore; the loop itself does no
// work, so the rank's clock stays behind the projection (no emergency).
const failSafeIteration = 300 * time.Millisecond

// failSafeRank is one trainer rank and what it logged.
type failSafeRank struct {
	tr   *client.Trainer
	logs *logsink.Recorder
}

// failSafeRun creates a run of two ranks due at b, with C and M of a second
// each and no environment snapshots, and starts both ranks with the plan.
func failSafeRun(ctx context.Context, t *testing.T, p *proc, id string, b time.Time) [2]failSafeRank {
	t.Helper()
	admin := dialClient(t, p.addr, "")
	resp, err := admin.Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: id, Spec: &v1.RunSpec{
		TrainerWorldSize: 2,
		Checkpointing:    &v1.CheckpointingSpec{MustSaveBy: timestamppb.New(b)},
		Reserve:          &v1.ReserveSpec{MarginSeconds: 1, ExpectedCheckpointSeconds: proto.Float64(1)},
	}})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	return startRanks(ctx, t, p.addr, id, resp.GetRunToken(), testFailSafe)
}

// startRanks starts the two ranks of run id with plan fs.
func startRanks(ctx context.Context, t *testing.T, addr, id, token string, fs client.FailSafeConfig) [2]failSafeRank {
	t.Helper()
	var ranks [2]failSafeRank
	for i := range ranks {
		logs := &logsink.Recorder{}
		tr, err := dialClient(t, addr, token).StartTrainer(ctx, client.TrainerConfig{
			RunID: id, Rank: int32(i), Logger: logs.Logger(), FailSafe: &fs})
		if err != nil {
			t.Fatalf("StartTrainer(rank %d): %v", i, err)
		}
		ranks[i] = failSafeRank{tr: tr, logs: logs}
	}
	return ranks
}

func dialClient(t *testing.T, addr, runToken string) *client.Client {
	t.Helper()
	cl, err := client.Dial(addr, client.WithInsecure(), client.WithRunToken(runToken))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// stepTogether has both ranks complete step and checks that the
// coordinator answered both CONTINUE.
func stepTogether(ctx context.Context, t *testing.T, ranks [2]failSafeRank, step int64) {
	t.Helper()
	var wg sync.WaitGroup
	var errs [2]error
	for i, r := range ranks {
		wg.Go(func() {
			d, err := r.tr.CompleteStep(ctx, step, failSafeIteration)
			if err == nil && d.GetAction() != v1.StepAction_STEP_ACTION_CONTINUE {
				err = fmt.Errorf("%v: %s", d.GetAction(), d.GetExplanation())
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d, step %d: %v", i, step, err)
		}
	}
}

// rankLoop is what one rank's training loop saw after the coordinator
// went away.
type rankLoop struct {
	local   []int64 // the steps the rank decided by itself
	fired   int64   // the step that said SAVE_AND_STOP, 0 if none
	firedAt time.Time
	err     error
}

// runLocally runs a rank's loop from step from on, as a training loop
// would: it saves and reports the checkpoint of a step that says
// SAVE_AND_STOP, and checks that the step after it says STOP. It ends
// there, or after the coordinator answered answered steps. started is told
// after each step the rank decided by itself.
func runLocally(ctx context.Context, r failSafeRank, from int64, answered int, started chan<- int64) rankLoop {
	var out rankLoop
	for step := from; step < from+200; step++ {
		d, err := r.tr.CompleteStep(ctx, step, failSafeIteration)
		if err != nil {
			out.err = fmt.Errorf("step %d: %w", step, err)
			return out
		}
		if strings.HasPrefix(d.GetExplanation(), "decided by this rank") {
			out.local = append(out.local, step)
			if started != nil {
				started <- step
			}
		} else if answered--; answered <= 0 {
			return out
		}
		if d.GetAction() != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
			continue
		}
		out.fired, out.firedAt = step, time.Now()
		if _, err := r.tr.ReportCheckpoint(ctx, step, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, 100*time.Millisecond); err != nil {
			out.err = fmt.Errorf("report the checkpoint of step %d: %w", step, err)
			return out
		}
		if d, err := r.tr.CompleteStep(ctx, step+1, failSafeIteration); err != nil || d.GetAction() != v1.StepAction_STEP_ACTION_STOP {
			out.err = fmt.Errorf("step %d after the fire: %v, %v", step+1, d.GetAction(), err)
		}
		return out
	}
	out.err = fmt.Errorf("no deadline save within 200 steps")
	return out
}

// bothLocally runs runLocally on both ranks at once.
func bothLocally(ctx context.Context, ranks [2]failSafeRank, from int64, answered int, started chan<- int64) [2]rankLoop {
	var out [2]rankLoop
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() { out[i] = runLocally(ctx, r, from, answered, started) })
	}
	wg.Wait()
	return out
}

// sameLocalFire checks that both ranks decided by themselves and saved at
// the same step, before b; it returns that step.
func sameLocalFire(t *testing.T, loops [2]rankLoop, b time.Time) int64 {
	t.Helper()
	for i, l := range loops {
		if l.err != nil {
			t.Fatalf("rank %d: %v", i, l.err)
		}
		if l.fired == 0 || len(l.local) == 0 || l.local[len(l.local)-1] != l.fired {
			t.Fatalf("rank %d: decided %v by itself, fired at %d: want a local fire", i, l.local, l.fired)
		}
		if !l.firedAt.Before(b) {
			t.Errorf("rank %d fired at %s, after B %s", i, l.firedAt.Format(time.RFC3339Nano), b.Format(time.RFC3339Nano))
		}
	}
	if loops[0].fired != loops[1].fired {
		t.Fatalf("the ranks fired at steps %d and %d: anchored on the same decision, they must agree", loops[0].fired, loops[1].fired)
	}
	return loops[0].fired
}

// wantWarnings checks each rank's WARNINGs: one on going its own way, and
// one when the coordinator answered again if back.
func wantWarnings(t *testing.T, ranks [2]failSafeRank, back bool) {
	t.Helper()
	for i, r := range ranks {
		warns := r.logs.At(slog.LevelWarn)
		want := 1
		if back {
			want = 2
		}
		if len(warns) != want || !strings.HasPrefix(warns[0], "the coordinator cannot answer") ||
			back && !strings.HasPrefix(warns[1], "the coordinator answers again") {
			t.Errorf("rank %d logged WARNINGs %q, want %d: going local%s", i, warns, want, map[bool]string{true: ", back"}[back])
		}
	}
}

// killAfterThreeSteps starts a run due at b whose two ranks complete three
// steps with the coordinator, which is then SIGKILLed.
func killAfterThreeSteps(ctx context.Context, t *testing.T, p *proc, id string, b time.Time) [2]failSafeRank {
	t.Helper()
	ranks := failSafeRun(ctx, t, p, id, b)
	for step := int64(1); step <= 3; step++ {
		stepTogether(ctx, t, ranks, step)
	}
	p.kill()
	return ranks
}

// fireWithoutCoordinator runs a run due in 8 s until both ranks saved by
// their plan, the coordinator killed after step 3; it returns the
// coordinator (not running), the ranks, B and the step they saved.
func fireWithoutCoordinator(ctx context.Context, t *testing.T, id string) (*proc, [2]failSafeRank, time.Time, int64) {
	t.Helper()
	p := startProc(t)
	b := time.Now().Add(8 * time.Second)
	ranks := killAfterThreeSteps(ctx, t, p, id, b)
	return p, ranks, b, sameLocalFire(t, bothLocally(ctx, ranks, 4, 0, nil), b)
}

// The coordinator is SIGKILLed for good mid-run: both ranks keep getting
// decisions, never an error, fire at the same step before B, and the
// checkpoint report of that save returns no error (it is queued). A rank
// that exits with it unreported says so in an ERROR.
func TestFailSafeCoordinatorGoneForGood(t *testing.T) {
	ctx := testContext(t)
	_, ranks, b, fired := fireWithoutCoordinator(ctx, t, "gone")
	t.Logf("both ranks fired at step %d, %s before B", fired, time.Until(b).Round(time.Millisecond))
	wantWarnings(t, ranks, false)
	closeRanks(ctx, ranks)
	for i, r := range ranks {
		errs := r.logs.At(slog.LevelError)
		if !slices.ContainsFunc(errs, func(m string) bool { return strings.HasPrefix(m, "exiting with what this rank did") }) {
			t.Errorf("rank %d exited with its reports undelivered and logged ERRORs %q, want one naming them", i, errs)
		}
	}
}

// The coordinator is SIGKILLed and comes back with its data directory lost
// (an empty one, the same address): it knows neither the run nor its
// token, and answers the ranks UNAUTHENTICATED. Both ranks go on by their
// plan as if it were out of reach, never an error in their loop, and save
// at the same step before B.
func TestFailSafeCoordinatorLostItsData(t *testing.T) {
	ctx := testContext(t)
	p := startProc(t)
	b := time.Now().Add(8 * time.Second)
	ranks := killAfterThreeSteps(ctx, t, p, "lost", b)
	if err := os.RemoveAll(p.dataDir); err != nil {
		t.Fatal(err)
	}
	p.restart()
	fired := sameLocalFire(t, bothLocally(ctx, ranks, 4, 0, nil), b)
	t.Logf("both ranks fired at step %d, %s before B", fired, time.Until(b).Round(time.Millisecond))
	wantWarnings(t, ranks, false)
	// Their workers went on following too (the coordinator may get its data
	// back): as the job's exit would, Close ends them.
	closeRanks(ctx, ranks)
}

// closeRanks closes each rank as a job exits, giving each 2 s to deliver
// what it has not reported to a coordinator that may not answer.
func closeRanks(ctx context.Context, ranks [2]failSafeRank) {
	for _, r := range ranks {
		closeCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = r.tr.Close(closeCtx)
		cancel()
	}
}

// The coordinator is SIGKILLed and restarted on its data a few seconds
// later, before the plan fired: the ranks report the steps they decided by
// themselves, the run goes on as usual, and its events show those steps.
func TestFailSafeCoordinatorBackBeforeTheFire(t *testing.T) {
	ctx := testContext(t)
	p := startProc(t)
	ranks := killAfterThreeSteps(ctx, t, p, "back", time.Now().Add(time.Hour))
	started := make(chan int64, 400)
	done := make(chan [2]rankLoop, 1)
	go func() { done <- bothLocally(ctx, ranks, 4, 3, started) }()
	// The outage lasts until each rank decided a few steps by itself: W,
	// then a probe P a step, about 2 s.
	for range 8 {
		<-started
	}
	p.restart()
	loops := <-done

	for i, l := range loops {
		if l.err != nil || l.fired != 0 || len(l.local) < 2 {
			t.Fatalf("rank %d: decided %v by itself, fired at %d, %v: want local steps, no fire, no error", i, l.local, l.fired, l.err)
		}
	}
	wantWarnings(t, ranks, true)
	for i, r := range ranks {
		if errs := r.logs.At(slog.LevelError); len(errs) > 0 {
			t.Errorf("rank %d logged ERRORs %q", i, errs)
		}
	}
	// A step both ranks decided by themselves shows so in the events; one
	// the other rank had asked about meanwhile keeps that decision (the
	// same CONTINUE, or the rank would have logged an ERROR).
	local := localDecisions(ctx, t, p, "back")
	for _, step := range loops[0].local {
		if slices.Contains(loops[1].local, step) && !local[step] {
			t.Errorf("both ranks decided step %d by themselves; the run's events show no such decision (local steps in the events: %v)", step, local)
		}
	}
	run := getRun(ctx, t, p, "back")
	if run.GetState() != v1.RunState_RUN_STATE_RUNNING || run.GetFireKind() != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_UNSPECIFIED {
		t.Errorf("run %v, fire kind %v: want RUNNING, not fired", run.GetState(), run.GetFireKind())
	}
	closeAll(ctx, t, ranks)
}

// The coordinator is SIGKILLed and comes back only after the ranks saved
// by their plan: when they exit, they report their steps and the
// checkpoint, and the run's deadline fired LOCAL at that step and ends as
// any deadline save does.
func TestFailSafeCoordinatorBackAfterTheFire(t *testing.T) {
	ctx := testContext(t)
	p, ranks, _, fired := fireWithoutCoordinator(ctx, t, "after")
	p.restart()
	closeAll(ctx, t, ranks)

	wantWarnings(t, ranks, true)
	run := getRun(ctx, t, p, "after")
	if run.GetFireKind() != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_LOCAL || run.GetFiredAtStep() != fired {
		t.Errorf("the run fired %v at step %d, want LOCAL at step %d", run.GetFireKind(), run.GetFiredAtStep(), fired)
	}
	if run.GetState() != v1.RunState_RUN_STATE_STOPPED || run.GetLastPublishedStep() != fired {
		t.Errorf("run %v with checkpoint %d published, want STOPPED with %d", run.GetState(), run.GetLastPublishedStep(), fired)
	}
	local := localDecisions(ctx, t, p, "after")
	for step := int64(4); step <= fired; step++ {
		if !local[step] {
			t.Errorf("step %d is not among the local decisions of the events: %v", step, local)
		}
	}
}

// localDecisions are the steps whose decision events say a rank decided
// them by itself.
func localDecisions(ctx context.Context, t *testing.T, p *proc, id string) map[int64]bool {
	t.Helper()
	r := &run{c: newCluster(t, p.addr), id: id}
	steps := map[int64]bool{}
	for _, ev := range r.events(ctx) {
		if ev.GetType() == v1.RunEventType_RUN_EVENT_TYPE_DECISION && strings.Contains(ev.GetDecision().GetExplanation(), "could not reach the coordinator") {
			steps[ev.GetStep()] = true
		}
	}
	return steps
}

func getRun(ctx context.Context, t *testing.T, p *proc, id string) *v1.Run {
	t.Helper()
	return (&run{c: newCluster(t, p.addr), id: id}).get(ctx)
}

func closeAll(ctx context.Context, t *testing.T, ranks [2]failSafeRank) {
	t.Helper()
	for i, r := range ranks {
		if err := r.tr.Close(ctx); err != nil {
			t.Errorf("close rank %d: %v", i, err)
		}
	}
}

// After a kill -9 and a restart on the same port and data 3 s later, a
// single-address client is answered within a second of the coordinator
// serving again: a rank stepping by its plan (its next CompleteStep goes
// to the coordinator), and a call blocked in the client's retries through
// the outage (GetRun). Three outages; the figures are logged.
func TestFailSafeAnsweredWithinASecondOfServing(t *testing.T) {
	ctx := testContext(t)
	p := startProc(t)
	ranks := failSafeRun(ctx, t, p, "reconnect", time.Now().Add(time.Hour))
	admin := dialClient(t, p.addr, "")
	answered := make(chan time.Time, 1000)
	stop := make(chan struct{})
	stepped := make(chan error, 1)
	go func() { stepped <- stepUntil(ctx, ranks[0].tr, stop, answered) }()
	var stepping, blocked []time.Duration
	for range 3 {
		<-answered // the rank is stepping with the coordinator
		p.kill()
		got := make(chan time.Time, 1)
		go func() {
			_, err := admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: "reconnect"})
			if err != nil {
				t.Errorf("GetRun through the outage: %v", err)
			}
			got <- time.Now()
		}()
		time.Sleep(3 * time.Second) // the outage itself, not a wait for anything
		drain(answered)
		p.restart()
		serving := time.Now()
		stepping = append(stepping, (<-answered).Sub(serving))
		blocked = append(blocked, (<-got).Sub(serving))
	}
	close(stop)
	if err := <-stepped; err != nil {
		t.Fatal(err)
	}
	closeAll(ctx, t, ranks)
	t.Logf("from SERVING to the next answer: a stepping rank's CompleteStep %v; a GetRun blocked through the outage %v", stepping, blocked)
	for _, d := range slices.Concat(stepping, blocked) {
		if d >= time.Second {
			t.Errorf("a call was answered %v after the coordinator served again, want under a second", d)
		}
	}
}

// stepUntil completes steps until stop, sending the time of each step the
// coordinator answered (not one the rank decided by itself) on answered.
func stepUntil(ctx context.Context, tr *client.Trainer, stop <-chan struct{}, answered chan<- time.Time) error {
	for step := int64(1); ; step++ {
		select {
		case <-stop:
			return nil
		default:
		}
		d, err := tr.CompleteStep(ctx, step, failSafeIteration)
		if err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		if !strings.HasPrefix(d.GetExplanation(), "decided by this rank") {
			answered <- time.Now()
		}
	}
}

func drain(c <-chan time.Time) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}
