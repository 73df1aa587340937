package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// snapshotFiles starts a sidecar whose hook writes its environment to a
// file named for the snapshot in a new directory, which it returns.
func (s *server) snapshotFilesSidecar(runID string) (*proc, string) {
	s.t.Helper()
	dir := s.t.TempDir()
	tok := s.turnRun(runID)
	return s.sidecar(runID, tok, "--on-snapshot", fmt.Sprintf("env > %s/$SNAPCOORD_SNAPSHOT_ID", dir)), dir
}

// savedSnapshots lists the snapshot ids the hook saved in dir.
func savedSnapshots(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids
}

func signalProc(t *testing.T, p *proc, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// Slurm's USR1 with the coordinator SIGKILLed: the sidecar saves the
// environment itself, as a deadline snapshot marked local; it keeps
// running, says when the coordinator is back, and then takes part in the
// coordinator's deadline snapshot as usual.
func TestSidecarBackstopSnapshotsWhenTheCoordinatorIsGone(t *testing.T) {
	s := startServer(t)
	sc, dir := s.snapshotFilesSidecar("gone")
	if err := s.coord.Kill(); err != nil {
		t.Fatal(err)
	}
	signalProc(t, sc, syscall.SIGUSR1)
	sc.waitFor(t, "the backstop snapshot", func(out string) bool { return strings.Contains(out, "backstop snapshot taken locally") })

	ids := savedSnapshots(t, dir)
	if len(ids) != 1 || !strings.HasPrefix(ids[0], "backstop-") {
		t.Fatalf("the hook saved %q, want one backstop-… snapshot", ids)
	}
	checkHookEnv(t, filepath.Join(dir, ids[0]), map[string]string{
		"SNAPCOORD_RUN_ID": "gone", "SNAPCOORD_SNAPSHOT_ID": ids[0], "SNAPCOORD_REASON": "deadline",
		"SNAPCOORD_BACKSTOP": "true", "SNAPCOORD_FORCED": "true", "SNAPCOORD_ANCHOR_STEP": "0", "SNAPCOORD_WORKER_NAME": "env-0",
	})

	s.coord = s.coord.RestartForTest(t)
	sc.waitFor(t, "the sidecar to see the coordinator back", func(out string) bool {
		return strings.Contains(out, "the coordinator answers again") && strings.Contains(out, "snapshot_id="+ids[0])
	})
	s.ok("run", "trigger", "gone")
	if code := sc.exitCode(t); code != 0 {
		t.Errorf("sidecar exit %d after Stop, want 0", code)
	}
	snap, rep := s.deadlineSnapshot("gone")
	if rep.GetOutcome() != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Errorf("the coordinator's deadline snapshot after the outage: report %v, want SAVED", rep)
	}
	if got := savedSnapshots(t, dir); !slices.Equal(got, []string{ids[0], snap.GetSnapshotId()}) {
		t.Errorf("the hook saved %q, want the backstop and then %s", got, snap.GetSnapshotId())
	}
	checkHookEnv(t, filepath.Join(dir, snap.GetSnapshotId()), map[string]string{"SNAPCOORD_BACKSTOP": "false"})
}

// The coordinator is SIGKILLed and comes back on the same address with its
// data directory lost: it knows neither the run nor its token. The sidecar
// goes on, as with the coordinator out of reach (one WARNING), and Slurm's
// USR1 still has it save the environment as a local deadline snapshot.
func TestSidecarBackstopSnapshotsWhenTheCoordinatorLostTheRun(t *testing.T) {
	s := startServer(t)
	sc, dir := s.snapshotFilesSidecar("lost")
	if err := s.coord.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(s.dataDir); err != nil {
		t.Fatal(err)
	}
	s.coord = s.coord.RestartForTest(t)
	const lost = "the coordinator no longer knows this run"
	sc.waitFor(t, "the sidecar to find the run lost", func(out string) bool { return strings.Contains(out, lost) })
	signalProc(t, sc, syscall.SIGUSR1)
	sc.waitFor(t, "the backstop snapshot", func(out string) bool { return strings.Contains(out, "backstop snapshot taken locally") })

	ids := savedSnapshots(t, dir)
	if len(ids) != 1 || !strings.HasPrefix(ids[0], "backstop-") {
		t.Fatalf("the hook saved %q, want one backstop-… snapshot", ids)
	}
	checkHookEnv(t, filepath.Join(dir, ids[0]), map[string]string{"SNAPCOORD_BACKSTOP": "true", "SNAPCOORD_REASON": "deadline"})
	select {
	case <-sc.done:
		t.Fatalf("the sidecar exited:\n%s", sc.out.String())
	default:
	}
	if n := strings.Count(sc.out.String(), lost); n != 1 {
		t.Errorf("the sidecar said %d times that the coordinator lost the run, want once", n)
	}
}

// With the coordinator alive the signal changes nothing: the deadline it
// fires brings the one deadline snapshot.
func TestSidecarBackstopSignalWithALiveCoordinator(t *testing.T) {
	s := startServer(t)
	sc, dir := s.snapshotFilesSidecar("alive")
	signalProc(t, sc, syscall.SIGUSR1)
	sc.waitFor(t, "the sidecar to find the coordinator", func(out string) bool {
		return strings.Contains(out, "backstop signal: the coordinator answers")
	})
	s.ok("run", "trigger", "alive")
	if code := sc.exitCode(t); code != 0 {
		t.Errorf("sidecar exit %d after Stop, want 0", code)
	}
	snap, _ := s.deadlineSnapshot("alive")
	if got := savedSnapshots(t, dir); !slices.Equal(got, []string{snap.GetSnapshotId()}) {
		t.Errorf("the hook saved %q, want only the deadline snapshot %s", got, snap.GetSnapshotId())
	}
	var resp v1.ListSnapshotsResponse
	s.getJSON(&resp, "snapshots", "alive")
	if n := len(resp.GetSnapshots()); n != 1 {
		t.Errorf("the run has %d snapshots, want the deadline's alone", n)
	}
}

func TestSidecarBackstopSignalFlag(t *testing.T) {
	s := startServer(t)
	r := s.wantExit(exitUsage, "sidecar", "--run", "r1", "--run-token", "t", "--on-snapshot", "true", "--backstop-signal", "TERM")
	if !strings.Contains(r.stderr, "backstop-signal") || !strings.Contains(r.stderr, "USR1, USR2, HUP, ALRM or none") {
		t.Errorf("a bad --backstop-signal says %q, want the flag and what it accepts", r.stderr)
	}
}

func lateDeadlineCmd(id string) *v1.Command {
	return &v1.Command{Kind: &v1.Command_SaveAtDeadline{SaveAtDeadline: &v1.SaveAtDeadlineCommand{
		SnapshotId: id, MustFinishBy: timestamppb.New(time.Now().Add(-time.Minute))}}}
}

// The backstop's snapshot is not reported (the coordinator issued none);
// a SaveAtDeadline that then arrives too late to run (the coordinator came
// back after its must_finish_by) is reported TIMEOUT, naming where the
// state was saved.
func TestSidecarNamesTheBackstopInALateDeadlineReport(t *testing.T) {
	f := &fakeReporter{}
	s := testSidecar("true", f)
	s.takeBackstop(t.Context(), nil, "backstop-1").wait()
	if len(f.reports) != 0 {
		t.Fatalf("the backstop snapshot was reported: %q", f.reports)
	}
	s.next(t.Context(), nil, lateDeadlineCmd("snap-3")).wait()
	if len(f.reports) != 1 || !strings.HasPrefix(f.reports[0], "snap-3 TIMEOUT: hook not started") ||
		!strings.Contains(f.reports[0], "saved by the local backstop snapshot backstop-1 at ") ||
		!strings.HasSuffix(f.reports[0], "(SAVED)") {
		t.Errorf("reports %q, want snap-3's TIMEOUT naming the backstop snapshot", f.reports)
	}
}

// Once this process ran the coordinator's deadline hook, the signal takes
// no other snapshot: the state is saved for the deadline.
func TestSidecarBackstopAfterTheDeadlineSnapshot(t *testing.T) {
	f := &fakeReporter{}
	s := testSidecar("true", f)
	deadline := s.next(t.Context(), nil, deadlineCmd("snap-2"))
	if again := s.takeBackstop(t.Context(), deadline, "backstop-1"); again != deadline {
		t.Error("the backstop started another hook after the deadline snapshot's")
	}
	deadline.wait()
	if want := []string{"snap-2 SAVED: "}; !slices.Equal(f.reports, want) {
		t.Errorf("reports %q, want %q", f.reports, want)
	}
}

// A regular hook still running at the backstop is killed (its snapshot
// cannot complete without the coordinator) and the deadline hook starts at
// once, not when the regular one is done.
func TestSidecarBackstopKillsARegularHook(t *testing.T) {
	f := &fakeReporter{}
	s := testSidecar(slowFirstHook, f)
	regular := s.next(t.Context(), nil, snapshotCmd("snap-1"))
	var local *hookRun
	within(t, "the backstop hook's start", func() { local = s.takeBackstop(t.Context(), regular, "backstop-1") })
	local.wait()
	want := []string{"snap-1 SKIPPED: hook killed: superseded by the local backstop snapshot (the coordinator was unreachable)"}
	if !slices.Equal(f.reports, want) {
		t.Errorf("reports %q, want %q", f.reports, want)
	}
	if b := s.backstopDone.Load(); b == nil || b.id != "backstop-1" || b.outcome != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Errorf("backstop taken: %+v, want backstop-1 SAVED", b)
	}
}
