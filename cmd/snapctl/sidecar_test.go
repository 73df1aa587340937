package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// sidecar starts `snapctl sidecar` for the run, configured the way a launch
// script does it: the run id and token from run create's exports.
func (s *server) sidecar(runID, token string, flags ...string) *proc {
	s.t.Helper()
	env := s.env("SNAPCOORD_RUN_ID="+runID, "SNAPCOORD_RUN_TOKEN="+token)
	p := startProc(s.t, env, bin.snapctl, append([]string{"sidecar", "--name", "env-0"}, flags...)...)
	p.waitFor(s.t, "the sidecar to register", func(out string) bool { return strings.Contains(out, "msg=registered") })
	return p
}

// turnRun creates a run with environment snapshots and returns its token.
func (s *server) turnRun(runID string, flags ...string) string {
	s.t.Helper()
	return s.createRun(runID, append([]string{"--world-size", "1", "--budget", "00:01:00:00", "--target-level", "turn"}, flags...)...)
}

// deadlineSnapshot returns the run's last snapshot and this worker's report.
func (s *server) deadlineSnapshot(runID string) (*v1.Snapshot, *v1.SnapshotReport) {
	s.t.Helper()
	var resp v1.ListSnapshotsResponse
	s.getJSON(&resp, "snapshots", runID)
	snaps := resp.GetSnapshots()
	if len(snaps) == 0 {
		s.t.Fatalf("run %s has no snapshot", runID)
	}
	last := snaps[len(snaps)-1]
	if len(last.GetReports()) == 0 {
		return last, nil
	}
	return last, last.GetReports()[0]
}

// The hook's exit status is the outcome; its environment describes the
// snapshot and holds no token.
func TestSidecarReportsHookExitStatus(t *testing.T) {
	s := startServer(t)
	for _, tc := range []struct {
		exit  int
		poll  bool
		want  v1.SnapshotOutcome
		state v1.RunState
	}{
		{0, false, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, v1.RunState_RUN_STATE_STOPPED},
		{0, true, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, v1.RunState_RUN_STATE_STOPPED},
		{3, false, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED, v1.RunState_RUN_STATE_STOPPED},
		{4, false, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_INVARIANT_FAILURE, v1.RunState_RUN_STATE_FAILED},
		{1, false, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, v1.RunState_RUN_STATE_STOPPED},
		{42, true, v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR, v1.RunState_RUN_STATE_STOPPED},
	} {
		runID := fmt.Sprintf("exit-%d-poll-%t", tc.exit, tc.poll)
		t.Run(runID, func(t *testing.T) {
			t.Parallel()
			envFile := filepath.Join(t.TempDir(), "env")
			tok := s.turnRun(runID)
			flags := []string{"--on-snapshot", fmt.Sprintf("env > %s; echo hook stderr >&2; exit %d", envFile, tc.exit)}
			if tc.poll {
				flags = append(flags, "--poll", "--poll-interval", "2s")
			}
			sc := s.sidecar(runID, tok, flags...)
			s.ok("run", "trigger", runID)
			if code := sc.exitCode(t); code != 0 {
				t.Errorf("sidecar exit %d after Stop, want 0", code)
			}

			snap, rep := s.deadlineSnapshot(runID)
			if rep.GetOutcome() != tc.want || rep.GetDurationSeconds() <= 0 {
				t.Errorf("hook exit %d reported %v after %v s, want %v with a duration", tc.exit, rep.GetOutcome(), rep.GetDurationSeconds(), tc.want)
			}
			if tc.exit != 0 && !strings.Contains(rep.GetMessage(), "hook stderr") {
				t.Errorf("report message %q lacks the hook's stderr", rep.GetMessage())
			}
			var run v1.Run
			s.getJSON(&run, "run", "get", runID)
			if run.GetState() != tc.state {
				t.Errorf("run %v, want %v", run.GetState(), tc.state)
			}
			checkHookEnv(t, envFile, map[string]string{
				"SNAPCOORD_RUN_ID": runID, "SNAPCOORD_SNAPSHOT_ID": snap.GetSnapshotId(), "SNAPCOORD_REASON": "deadline",
				"SNAPCOORD_ANCHOR_STEP": "0", "SNAPCOORD_FORCED": "true",
				"SNAPCOORD_MUST_FINISH_BY": snap.GetMustFinishBy().AsTime().UTC().Format(time.RFC3339),
				"SNAPCOORD_RUN_TOKEN":      "", "SNAPCOORD_TOKEN": "",
			})
		})
	}
}

func checkHookEnv(t *testing.T, path string, want map[string]string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the hook did not run: %v", err)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			got[k] = v
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("hook environment %s=%q, want %q", k, got[k], v)
		}
	}
}

// A hook still running at must_finish_by is killed with everything it
// started, and the snapshot times out.
func TestSidecarKillsHookAtMustFinishBy(t *testing.T) {
	s := startServer(t)
	b := time.Now().Add(3 * time.Second).UTC().Format(time.RFC3339Nano)
	tok := s.createRun("r1", "--world-size", "1", "--must-save-by", b, "--target-level", "turn")
	pidFile := filepath.Join(t.TempDir(), "pid")
	sc := s.sidecar("r1", tok, "--on-snapshot", fmt.Sprintf("sleep 60 & echo $! > %s; wait", pidFile))
	began := time.Now()
	s.ok("run", "trigger", "r1")
	if code := sc.exitCode(t); code != 0 {
		t.Errorf("sidecar exit %d, want 0", code)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("the sidecar took %v: the hook was not killed at must_finish_by", took)
	}
	snap, _ := s.deadlineSnapshot("r1")
	if snap.GetOutcome() != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_TIMEOUT {
		t.Errorf("deadline snapshot %v, want TIMEOUT", snap.GetOutcome())
	}
	if !strings.Contains(sc.out.String(), "outcome=TIMEOUT") {
		t.Errorf("the sidecar did not classify the kill as TIMEOUT:\n%s", sc.out.String())
	}
	b2, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("hook pid: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b2)))
	if alive(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("the hook's child %d survived the kill", pid)
	}
}

// alive: the process exists and is not a zombie (a killed orphan may wait
// for a reaper that a container's init never is).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

func TestSidecarStopHook(t *testing.T) {
	s := startServer(t)
	for _, tc := range []struct {
		name   string
		onStop string
		code   int
	}{
		{"succeeds", `echo "$SNAPCOORD_RUN_ID: $SNAPCOORD_STOP_REASON" > %s`, 0},
		{"fails", `echo ran > %s; exit 1`, exitStopHook},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runID := "stop-" + tc.name
			out := filepath.Join(t.TempDir(), "stopped")
			tok := s.turnRun(runID)
			sc := s.sidecar(runID, tok, "--on-snapshot", "true", "--on-stop", fmt.Sprintf(tc.onStop, out))
			s.ok("run", "cancel", runID, "--reason", "bad data")
			if code := sc.exitCode(t); code != tc.code {
				t.Errorf("sidecar exit %d, want %d", code, tc.code)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("the stop hook did not run: %v", err)
			}
			if tc.code == 0 && !strings.Contains(string(b), runID+": CANCELLED: bad data") {
				t.Errorf("stop hook saw %q", b)
			}
		})
	}
}

func TestSidecarLeavesOnSIGTERM(t *testing.T) {
	s := startServer(t)
	tok := s.turnRun("r1")
	sc := s.sidecar("r1", tok, "--on-snapshot", "true")
	if err := sc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := sc.exitCode(t); code != 0 {
		t.Errorf("sidecar exit %d after SIGTERM, want 0", code)
	}
	var workers v1.ListWorkersResponse
	s.getJSON(&workers, "workers", "r1")
	if len(workers.GetWorkers()) != 1 || workers.GetWorkers()[0].GetState() != v1.WorkerState_WORKER_STATE_LEFT {
		t.Errorf("after SIGTERM the workers are %v, want one LEFT", workers.GetWorkers())
	}
}

func TestSidecarWithAWrongToken(t *testing.T) {
	s := startServer(t)
	s.turnRun("r1")
	r := s.snapctlEnv([]string{"SNAPCOORD_RUN_ID=r1", "SNAPCOORD_RUN_TOKEN=wrong"}, "sidecar", "--on-snapshot", "true")
	if r.code != exitAuth {
		t.Errorf("sidecar with a wrong token: exit %d, want %d: %s", r.code, exitAuth, r.stderr)
	}
}

// One sidecar can run a node's environment workers over one connection:
// each registers under its own name, and each snapshot runs each worker's
// hook, told which worker it is for.
func TestSidecarRunsSeveralWorkersOverOneConnection(t *testing.T) {
	s := startServer(t)
	dir := t.TempDir()
	tok := s.turnRun("node")
	env := s.env("SNAPCOORD_RUN_ID=node", "SNAPCOORD_RUN_TOKEN="+tok)
	sc := startProc(t, env, bin.snapctl, "sidecar", "--name", "node-a", "--workers", "3",
		"--on-snapshot", fmt.Sprintf(`env > %s/$SNAPCOORD_WORKER_INDEX`, dir),
		"--on-stop", fmt.Sprintf(`echo "$SNAPCOORD_WORKER_NAME" > %s/stopped-$SNAPCOORD_WORKER_INDEX`, dir))
	sc.waitFor(t, "three workers to register", func(out string) bool { return strings.Count(out, "msg=registered") == 3 })

	s.ok("run", "trigger", "node")
	if code := sc.exitCode(t); code != 0 {
		t.Fatalf("sidecar exit %d after Stop, want 0:\n%s", code, sc.out.String())
	}
	snap, _ := s.deadlineSnapshot("node")
	if got := len(snap.GetReports()); got != 3 || snap.GetOutcome() != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Errorf("deadline snapshot %v with %d reports, want SAVED by 3", snap.GetOutcome(), got)
	}
	for i := range 3 {
		name := fmt.Sprintf("node-a-%d", i)
		checkHookEnv(t, filepath.Join(dir, strconv.Itoa(i)), map[string]string{
			"SNAPCOORD_WORKER_NAME": name, "SNAPCOORD_WORKER_INDEX": strconv.Itoa(i),
			"SNAPCOORD_SNAPSHOT_ID": snap.GetSnapshotId(), "SNAPCOORD_RUN_TOKEN": "",
		})
		if b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("stopped-%d", i))); err != nil || strings.TrimSpace(string(b)) != name {
			t.Errorf("stop hook of worker %d: %q, %v; want %s", i, b, err, name)
		}
	}
	if peers := registrationPeers(t, s.coord.Log(), "node"); len(peers) != 1 {
		t.Errorf("the workers registered from %d connections (%v), want one", len(peers), peers)
	}
}

// registrationPeers reads the coordinator's JSON log: the client addresses
// that registered workers in the run.
func registrationPeers(t *testing.T, logs, runID string) map[string]int {
	t.Helper()
	peers := map[string]int{}
	for _, line := range strings.Split(logs, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["grpc.method"] != "RegisterWorker" || rec["run_id"] != runID {
			continue
		}
		addr, _ := rec["peer.address"].(string)
		peers[addr]++
	}
	return peers
}

// A second sidecar under the same name (a replacement started while the
// first still runs): the first exits with the conflict status, saying why,
// and leaves the replacement registered.
func TestSupersededSidecarExits(t *testing.T) {
	s := startServer(t)
	tok := s.turnRun("r1")
	first := s.sidecar("r1", tok, "--on-snapshot", "true")
	s.sidecar("r1", tok, "--on-snapshot", "true")
	if code := first.exitCode(t); code != exitConflict {
		t.Errorf("superseded sidecar exit %d, want %d", code, exitConflict)
	}
	if out := first.out.String(); !strings.Contains(out, "another process registered under this worker's name") {
		t.Errorf("superseded sidecar does not say why:\n%s", out)
	}
	var workers v1.ListWorkersResponse
	s.getJSON(&workers, "workers", "r1")
	if ws := workers.GetWorkers(); len(ws) != 1 || ws[0].GetState() != v1.WorkerState_WORKER_STATE_LIVE || ws[0].GetIncarnation() != 2 {
		t.Errorf("after the first sidecar exited the workers are %v, want the replacement's incarnation 2 LIVE", ws)
	}
}

// intervalHook is a --on-snapshot that takes a minute for an interval
// snapshot and no time for any other.
const intervalHook = `if [ "$SNAPCOORD_REASON" = interval ]; then sleep 60; fi`

// sidecarInIntervalHook starts a sidecar on a run with a snapshot every
// second, and waits until its interval hook runs.
func (s *server) sidecarInIntervalHook(runID string, flags ...string) *proc {
	s.t.Helper()
	tok := s.turnRun(runID, "--snapshot-interval", "1")
	sc := s.sidecar(runID, tok, append([]string{"--on-snapshot", intervalHook}, flags...)...)
	sc.waitFor(s.t, "the interval hook to start", func(out string) bool { return strings.Contains(out, "reason=interval") })
	return sc
}

// snapshotOf returns the run's first snapshot for reason.
func (s *server) snapshotOf(runID string, reason v1.SnapshotReason) *v1.Snapshot {
	s.t.Helper()
	var resp v1.ListSnapshotsResponse
	s.getJSON(&resp, "snapshots", runID)
	for _, snap := range resp.GetSnapshots() {
		if snap.GetReason() == reason {
			return snap
		}
	}
	s.t.Fatalf("run %s has no %v snapshot: %v", runID, reason, resp.GetSnapshots())
	return nil
}

// SaveAtDeadline while a regular snapshot's hook runs (killed only after
// --hook-timeout): the deadline hook must not wait behind it and miss B.
// The coordinator superseded the regular snapshot, so the sidecar kills
// its hook and reports it skipped.
func TestSidecarDeadlineKillsARegularHook(t *testing.T) {
	s := startServer(t)
	sc := s.sidecarInIntervalHook("r1")
	began := time.Now()
	s.ok("run", "trigger", "r1")
	if code := sc.exitCode(t); code != 0 {
		t.Errorf("sidecar exit %d after Stop, want 0", code)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("the deadline save took %v: it waited for the interval hook", took)
	}
	if snap, rep := s.deadlineSnapshot("r1"); snap.GetOutcome() != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Errorf("deadline snapshot %v (report %v), want SAVED", snap.GetOutcome(), rep)
	}
	reps := s.snapshotOf("r1", v1.SnapshotReason_SNAPSHOT_REASON_INTERVAL).GetReports()
	if len(reps) != 1 || reps[0].GetOutcome() != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SKIPPED ||
		!strings.Contains(reps[0].GetMessage(), "hook killed: superseded by the deadline snapshot") {
		t.Errorf("interval snapshot reports %v, want this worker's SKIPPED: superseded by the deadline snapshot", reps)
	}
}

// A hook still running when the sidecar must leave is killed: at a Stop
// without a report (the run is over), at SIGTERM reported IO_ERROR.
func TestSidecarLeavingKillsTheHook(t *testing.T) {
	s := startServer(t)
	for _, tc := range []struct {
		name    string
		leave   func(sc *proc, runID string)
		message string // the interval snapshot's report; "": none
	}{
		{"stop", func(_ *proc, runID string) { s.ok("run", "cancel", runID, "--reason", "test") }, ""},
		{"sigterm", func(sc *proc, _ string) { _ = sc.cmd.Process.Signal(syscall.SIGTERM) }, "hook killed: the sidecar is shutting down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runID := "leave-" + tc.name
			stopped := filepath.Join(t.TempDir(), "stopped")
			sc := s.sidecarInIntervalHook(runID, "--on-stop", "touch "+stopped)
			began := time.Now()
			tc.leave(sc, runID)
			if code := sc.exitCode(t); code != 0 {
				t.Errorf("sidecar exit %d, want 0", code)
			}
			if took := time.Since(began); took > 10*time.Second {
				t.Errorf("the sidecar took %v to leave: the hook was not killed", took)
			}
			if _, err := os.Stat(stopped); (err == nil) != (tc.name == "stop") {
				t.Errorf("stop hook ran: %v, want only at Stop", err == nil)
			}
			reps := s.snapshotOf(runID, v1.SnapshotReason_SNAPSHOT_REASON_INTERVAL).GetReports()
			if tc.message == "" && len(reps) != 0 ||
				tc.message != "" && (len(reps) != 1 || reps[0].GetOutcome() != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_IO_ERROR ||
					!strings.Contains(reps[0].GetMessage(), tc.message)) {
				t.Errorf("interval snapshot reports %v, want %q", reps, tc.message)
			}
		})
	}
}

// testSidecar is a sidecar without a coordinator: commands are handed to
// next, the hook is onSnapshot, and f takes the reports.
func testSidecar(onSnapshot string, f *fakeReporter) *sidecar {
	rep, _ := testReporter(f)
	return &sidecar{c: &cli{env: env{stdout: io.Discard, stderr: io.Discard}},
		cfg: sidecarConfig{onSnapshot: onSnapshot, hookTimeout: time.Hour}, rep: rep, log: rep.log}
}

func snapshotCmd(id string) *v1.Command {
	return &v1.Command{Kind: &v1.Command_Snapshot{Snapshot: &v1.SnapshotCommand{
		SnapshotId: id, Reason: v1.SnapshotReason_SNAPSHOT_REASON_INTERVAL}}}
}

func deadlineCmd(id string) *v1.Command {
	return &v1.Command{Kind: &v1.Command_SaveAtDeadline{SaveAtDeadline: &v1.SaveAtDeadlineCommand{SnapshotId: id}}}
}

// slowFirstHook takes a minute for snap-1 and no time for any other.
const slowFirstHook = `if [ "$SNAPCOORD_SNAPSHOT_ID" = snap-1 ]; then sleep 60; fi`

// A Snapshot while another snapshot's hook runs: the coordinator issued it
// only after completing that one without this worker (it timed out), so
// the sidecar kills that hook, reports it TIMEOUT and starts the new one at
// once. Waiting for the old hook instead (up to --hook-timeout), serve
// would read no command meanwhile, and a SaveAtDeadline would wait too.
func TestSidecarNewerSnapshotKillsTheRunningHook(t *testing.T) {
	f := &fakeReporter{}
	s := testSidecar(slowFirstHook, f)
	first := s.next(t.Context(), nil, snapshotCmd("snap-1"))
	var second *hookRun
	within(t, "the newer snapshot", func() { second = s.next(t.Context(), first, snapshotCmd("snap-2")) })
	second.wait()

	want := []string{"snap-1 TIMEOUT: hook killed: the coordinator issued a newer snapshot (this one had timed out)", "snap-2 SAVED: "}
	if !slices.Equal(f.reports, want) {
		t.Errorf("reports %q, want %q", f.reports, want)
	}
}

// A command for the snapshot whose hook runs is a repeat delivery: the
// hook goes on, and no other starts.
func TestSidecarRepeatedSnapshotLeavesItsHookRunning(t *testing.T) {
	for _, tc := range []struct {
		name   string
		repeat *v1.Command
	}{{"snapshot", snapshotCmd("snap-1")}, {"deadline", deadlineCmd("snap-1")}} {
		t.Run(tc.name, func(t *testing.T) {
			repeat := tc.repeat
			f := &fakeReporter{}
			s := testSidecar(slowFirstHook, f)
			first := s.next(t.Context(), nil, repeat)
			var again *hookRun
			within(t, "the repeat", func() { again = s.next(t.Context(), first, repeat) })

			select {
			case <-first.done:
				t.Errorf("the hook ended at the repeat; reports %q", f.reports)
			default:
			}
			if again != first {
				t.Error("the repeat started another hook")
			}
			first.kill(errRunStopped) // unreported
		})
	}
}

// A SaveAtDeadline while the coordinator is unreachable (it restarts right
// after issuing it): the deadline hook starts once the superseded hook is
// killed and its report given up, not after the client's retries.
func TestSidecarDeadlineHookDoesNotWaitForAnOutage(t *testing.T) {
	f := &fakeReporter{answer: func(ctx context.Context, _ int) error {
		<-ctx.Done() // the coordinator does not answer
		return status.Error(codes.Unavailable, "connection refused")
	}}
	s := testSidecar("sleep 60", f)
	s.rep.attemptTimeout, s.rep.killedTimeout = time.Hour, time.Millisecond
	first := s.next(t.Context(), nil, snapshotCmd("snap-1"))
	var deadline *hookRun
	within(t, "the deadline hook's start", func() { deadline = s.next(t.Context(), first, deadlineCmd("snap-2")) })
	deadline.kill(errRunStopped) // unreported: its report would wait for the coordinator

	if len(f.reports) != 1 || !strings.HasPrefix(f.reports[0], "snap-1 SKIPPED: hook killed: superseded") {
		t.Errorf("reports %q, want snap-1's SKIPPED, superseded", f.reports)
	}
}

// A sidecar given two addresses keeps following its commands when the
// coordinator goes down on one and comes back on the other (its data
// served from another machine, as after a failover): it runs the deadline
// hook, reports, and exits after the Stop.
func TestSidecarFollowsTheCoordinatorToAnotherAddress(t *testing.T) {
	s := startServer(t)
	other := closedPort(t)
	tok := s.turnRun("failover")
	sc := s.sidecar("failover", tok, "--addr", s.addr+","+other, "--on-snapshot", "true")
	if err := s.coord.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	s.coord = s.coord.RestartAtForTest(t, other)
	s.addr = other
	s.ok("run", "trigger", "failover")
	if code := sc.exitCode(t); code != 0 {
		t.Errorf("sidecar exit %d after Stop, want 0", code)
	}
	if _, rep := s.deadlineSnapshot("failover"); rep.GetOutcome() != v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED {
		t.Errorf("deadline snapshot report %v, want SAVED", rep)
	}
}
