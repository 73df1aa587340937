package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A NeMo RL config as such files look: the keys snapcoord reads among many
// it does not.
const nemoRLYAML = `
grpo:
  num_prompts_per_step: 32
  max_num_steps: 1000
policy:
  model_name: Qwen/Qwen2.5-7B
checkpointing:
  enabled: true
  checkpoint_dir: results/grpo
  save_period: 10
  checkpoint_must_save_by: "00:03:45:00"
  deferred_finalize: true
rollout_checkpointing:
  snapshot_attempt_interval_s: null
  snapshot_on_trainer_checkpoint: false
  max_consecutive_failures: 5
  snapshot_timeout_s: 300
rollout_recovery:
  target_level: turn
cluster:
  num_nodes: 4
  gpus_per_node: 8
`

func TestRunCreateFromNemoRL(t *testing.T) {
	t.Parallel() // snapctl's output only: no timing to disturb
	s := startServer(t)
	cfg := writeFile(t, "grpo.yaml", nemoRLYAML)
	s.createRun("r1", "--from-nemo-rl", cfg, "--world-size", "32")
	var run v1.Run
	s.getJSON(&run, "run", "get", "r1")
	spec := run.GetSpec()
	ck, rc := spec.GetCheckpointing(), spec.GetRolloutCheckpointing()
	if spec.GetTrainerWorldSize() != 32 || ck.GetCheckpointMustSaveBy() != "00:03:45:00" || !ck.GetDeferredFinalize() ||
		rc.SnapshotAttemptIntervalS != nil || rc.GetSnapshotOnTrainerCheckpoint() || rc.GetMaxConsecutiveFailures() != 5 ||
		rc.GetSnapshotTimeoutS() != 300 || spec.GetRolloutRecovery().GetTargetLevel() != v1.TargetLevel_TARGET_LEVEL_TURN {
		t.Errorf("spec from %s = %v", cfg, spec)
	}

	// Flags win over the file.
	s.createRun("r2", "--from-nemo-rl", cfg, "--world-size", "8", "--deferred-finalize=false",
		"--snapshot-interval", "120", "--target-level", "prefix", "--budget", "00:01:00:00")
	s.getJSON(&run, "run", "get", "r2")
	spec = run.GetSpec()
	if spec.GetCheckpointing().GetDeferredFinalize() || spec.GetRolloutCheckpointing().GetSnapshotAttemptIntervalS() != 120 ||
		spec.GetRolloutRecovery().GetTargetLevel() != v1.TargetLevel_TARGET_LEVEL_PREFIX ||
		spec.GetCheckpointing().GetCheckpointMustSaveBy() != "00:01:00:00" || spec.GetRolloutCheckpointing().GetMaxConsecutiveFailures() != 5 {
		t.Errorf("spec from %s with flags = %v", cfg, spec)
	}
}

func TestRunCreateFromBadNemoRL(t *testing.T) {
	s := startServer(t)
	for name, content := range map[string]string{
		"unknown level":  "rollout_recovery:\n  target_level: rollouts\n",
		"interpolation":  "checkpointing:\n  checkpoint_must_save_by: ${oc.env:BUDGET}\n",
		"wrong type":     "rollout_checkpointing:\n  snapshot_timeout_s: soon\n",
		"not YAML":       "checkpointing: [\n",
		"rejected spec":  "checkpointing:\n  checkpoint_must_save_by: 3h\n",
		"never saves":    "rollout_recovery:\n  target_level: turn\nrollout_checkpointing:\n  snapshot_on_trainer_checkpoint: false\n",
		"deferred+timer": "checkpointing:\n  deferred_finalize: true\nrollout_checkpointing:\n  snapshot_attempt_interval_s: 300\n",
	} {
		t.Run(name, func(t *testing.T) {
			cfg := writeFile(t, "bad.yaml", content)
			r := s.wantExit(exitInvalid, "run", "create", "bad", "--from-nemo-rl", cfg, "--world-size", "1")
			if !strings.HasPrefix(r.stderr, "snapctl: ") {
				t.Errorf("stderr %q", r.stderr)
			}
		})
	}
	s.wantExit(exitInvalid, "run", "create", "bad", "--from-nemo-rl", filepath.Join(t.TempDir(), "missing.yaml"), "--world-size", "1")
}

// fakeSlurm is a squeue and a scontrol on PATH that answer for job 42 as
// Slurm 22.05 does: local time without a zone unless SLURM_TIME_FORMAT says
// otherwise. The test moves the job's times by writing the files start and
// end (epoch seconds); squeue-fails makes squeue fail, ignore-format makes
// both ignore SLURM_TIME_FORMAT (local time only), and an end of "N/A" is a
// job without one.
type fakeSlurm struct {
	t   *testing.T
	dir string
}

const fakeSlurmScript = `#!/bin/sh
fake=$(dirname "$0")
fmt_time() { # epoch or N/A -> what Slurm prints
	v=$(cat "$fake/$1")
	if [ "$v" = N/A ] || { [ "$SLURM_TIME_FORMAT" = %s ] && [ ! -f "$fake/ignore-format" ]; }; then
		echo "$v"
	else
		date -d "@$v" +%Y-%m-%dT%H:%M:%S
	fi
}
case "$(basename "$0") $*" in
"squeue -h -j 42 -o %S")
	[ -f "$fake/squeue-fails" ] && { echo "squeue: error: slurm_load_jobs error: Socket timed out" >&2; exit 1; }
	fmt_time start ;;
"squeue -h -j 42 -o %e")
	[ -f "$fake/squeue-fails" ] && { echo "squeue: error: slurm_load_jobs error: Socket timed out" >&2; exit 1; }
	fmt_time end ;;
"scontrol show job 42")
	echo "JobId=42 JobName=grpo.sbatch"
	echo "   RunTime=00:00:10 TimeLimit=04:00:00 TimeMin=N/A"
	echo "   SubmitTime=$(fmt_time start) EligibleTime=$(fmt_time start)"
	echo "   StartTime=$(fmt_time start) EndTime=$(fmt_time end) Deadline=N/A" ;;
*)
	echo "$(basename "$0"): unexpected arguments: $*" >&2; exit 2 ;;
esac
`

func newFakeSlurm(t *testing.T, start, end time.Time) *fakeSlurm {
	t.Helper()
	f := &fakeSlurm{t: t, dir: t.TempDir()}
	for _, name := range []string{"squeue", "scontrol"} {
		if err := os.WriteFile(filepath.Join(f.dir, name), []byte(fakeSlurmScript), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f.set("start", strconv.FormatInt(start.Unix(), 10))
	f.set("end", strconv.FormatInt(end.Unix(), 10))
	return f
}

func (f *fakeSlurm) set(name, content string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(content+"\n"), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSlurm) unset(name string) {
	f.t.Helper()
	if err := os.Remove(filepath.Join(f.dir, name)); err != nil {
		f.t.Fatal(err)
	}
}

// env is a job step's environment: SLURM_JOB_ID and the fakes first on
// PATH. Like Slurm 22.05, it sets no SLURM_JOB_START_TIME/END_TIME.
func (f *fakeSlurm) env(extra ...string) []string {
	return append([]string{"SLURM_JOB_ID=42", "PATH=" + f.dir + string(os.PathListSeparator) + os.Getenv("PATH")}, extra...)
}

func (s *server) getRun(runID string) *v1.Run {
	s.t.Helper()
	var run v1.Run
	s.getJSON(&run, "run", "get", runID)
	return &run
}

func TestSlurmTimes(t *testing.T) {
	t.Parallel() // snapctl's output only: no timing to disturb
	s := startServer(t)
	start := time.Now().Add(-10 * time.Minute).Truncate(time.Second)
	end := start.Add(4 * time.Hour)
	slurm := newFakeSlurm(t, start, end)
	create := func(runID string, flags ...string) *v1.Run {
		t.Helper()
		args := append([]string{"run", "create", runID, "--world-size", "1"}, flags...)
		if r := s.snapctlEnv(slurm.env(), args...); r.code != 0 {
			t.Fatalf("snapctl %v: exit %d: %s", args, r.code, r.stderr)
		}
		return s.getRun(runID)
	}

	run := create("budget", "--started-at", "slurm", "--budget", "00:03:45:00")
	if got := run.GetSpec().GetStartedAt().AsTime(); !got.Equal(start) {
		t.Errorf("--started-at slurm: started_at %v, want the job's start %v", got, start)
	}
	if got := run.GetDeadline().GetMustSaveBy().AsTime(); !got.Equal(start.Add(3*time.Hour + 45*time.Minute)) {
		t.Errorf("B = %v, want start + 3h45m", got)
	}
	run = create("end", "--must-save-by", "slurm")
	if got := run.GetDeadline().GetMustSaveBy().AsTime(); !got.Equal(end) {
		t.Errorf("--must-save-by slurm: B = %v, want the job's end %v", got, end)
	}
	for _, offset := range []string{"slurm-10m", "slurm-00:10:00", "slurm-10:00"} {
		run = create("end-"+strings.ReplaceAll(offset, ":", ""), "--must-save-by", offset)
		if got := run.GetDeadline().GetMustSaveBy().AsTime(); !got.Equal(end.Add(-10 * time.Minute)) {
			t.Errorf("--must-save-by %s: B = %v, want %v", offset, got, end.Add(-10*time.Minute))
		}
	}

	// scontrol update extended the job: extend reads the new end. The
	// environment did not change (it cannot, in a running job).
	extend := func(end time.Time) {
		t.Helper()
		slurm.set("end", strconv.FormatInt(end.Unix(), 10))
		if r := s.snapctlEnv(slurm.env(), "run", "extend", "end", "--must-save-by", "slurm"); r.code != 0 {
			t.Fatalf("run extend --must-save-by slurm: exit %d: %s", r.code, r.stderr)
		}
		if got := s.getRun("end").GetDeadline().GetMustSaveBy().AsTime(); !got.Equal(end) {
			t.Errorf("after extend: B = %v, want the job's new end %v", got, end)
		}
	}
	extend(end.Add(time.Hour))
	// squeue down: scontrol show job.
	slurm.set("squeue-fails", "")
	extend(end.Add(2 * time.Hour))
	// A Slurm that prints local time whatever SLURM_TIME_FORMAT says: read
	// in the process's zone (Europe/Paris here), not as UTC.
	slurm.set("ignore-format", "")
	extend(end.Add(3 * time.Hour))
	slurm.unset("squeue-fails")
	extend(end.Add(4 * time.Hour))
	slurm.unset("ignore-format")

	// A job without an end time: invalid input, naming what Slurm said.
	slurm.set("end", "N/A")
	r := s.snapctlEnv(slurm.env(), "run", "extend", "end", "--must-save-by", "slurm")
	if r.code != exitInvalid || !strings.Contains(r.stderr, `"N/A" is not a time`) {
		t.Errorf("end N/A: exit %d, want %d with the value (%s)", r.code, exitInvalid, r.stderr)
	}

	// Without squeue or scontrol: SLURM_JOB_*_TIME (set at launch by newer
	// Slurm versions) for run create, but never for run extend, which
	// must see an extension.
	launch := []string{fmt.Sprintf("SLURM_JOB_START_TIME=%d", start.Unix()), fmt.Sprintf("SLURM_JOB_END_TIME=%d", end.Unix())}
	if r := s.snapctlEnv(launch, "run", "create", "vars", "--world-size", "1", "--must-save-by", "slurm"); r.code != 0 {
		t.Fatalf("create from SLURM_JOB_END_TIME: exit %d: %s", r.code, r.stderr)
	}
	if got := s.getRun("vars").GetDeadline().GetMustSaveBy().AsTime(); !got.Equal(end) {
		t.Errorf("from SLURM_JOB_END_TIME: B = %v, want %v", got, end)
	}
	r = s.snapctlEnv(append(launch, "SLURM_JOB_ID=42", "PATH=/nonexistent"), "run", "extend", "vars", "--must-save-by", "slurm")
	if r.code != exitInvalid || !strings.Contains(r.stderr, "does not follow scontrol update") {
		t.Errorf("extend without squeue: exit %d, want %d saying why the variable is not used (%s)", r.code, exitInvalid, r.stderr)
	}

	// Outside Slurm, or with garbage in the variable: invalid input.
	s.wantExit(exitInvalid, "run", "create", "x", "--world-size", "1", "--started-at", "slurm")
	if r := s.snapctlEnv([]string{"SLURM_JOB_END_TIME=tomorrow"}, "run", "create", "x", "--world-size", "1", "--must-save-by", "slurm"); r.code != exitInvalid {
		t.Errorf("SLURM_JOB_END_TIME=tomorrow: exit %d, want %d (%s)", r.code, exitInvalid, r.stderr)
	}
}

// An int flag for an int32 field that does not fit is a usage error naming
// the flag: converted unchecked, --world-size 4294967297 wraps to 1.
func TestRunCreateIntFlagsOutOfRange(t *testing.T) {
	s := startServer(t)
	// --snapshot-interval and --snapshot-timeout are durations, read as
	// seconds: a negative one is refused before the range is checked.
	for _, flag := range []string{"world-size", "snapshot-interval", "max-consecutive-failures", "snapshot-timeout", "reserve-window"} {
		for _, v := range []string{"4294967297", "-4294967297"} {
			args := []string{"run", "create", "r1", "--world-size", "1", "--" + flag, v}
			if r := s.wantExit(exitUsage, args...); !strings.Contains(r.stderr, "--"+flag) || !strings.Contains(r.stderr, v) {
				t.Errorf("snapctl %v: stderr %q does not name the flag", args, r.stderr)
			}
		}
	}
	s.wantExit(exitNotFound, "run", "get", "r1") // nothing was created
}

// A requeued Slurm job keeps its SLURM_JOB_ID: run create finds the run its
// first allocation made, whose workers registered, and prints no token.
// run reissue-token gives the new allocation one, and the earlier one stops
// working.
func TestReissueTokenAfterRequeue(t *testing.T) {
	t.Parallel() // snapctl's output only: no timing to disturb
	s := startServer(t)
	spec := []string{"--world-size", "1", "--budget", "00:01:00:00", "--target-level", "turn"}
	tok := s.createRun("grpo-42", spec...)
	first := s.sidecar("grpo-42", tok, "--on-snapshot", "true")
	// The node died: no deregistration.
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.done

	s.wantExit(exitConflict, append([]string{"run", "create", "grpo-42"}, spec...)...)
	r := s.snapctl("run", "reissue-token", "grpo-42", "--reason", "job 42 requeued, restart 1")
	m := regexp.MustCompile(`(?m)^export SNAPCOORD_RUN_TOKEN='([^']+)'$`).FindStringSubmatch(r.stdout)
	if r.code != 0 || m == nil || m[1] == tok || !strings.Contains(r.stdout, "export SNAPCOORD_RUN_ID='grpo-42'\n") {
		t.Fatalf("run reissue-token: exit %d, stdout %q, want a new token to eval (stderr %s)", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stderr, "no longer works") {
		t.Errorf("stderr %q does not say the earlier token stopped working", r.stderr)
	}
	// The earlier token is refused; the new one registers the same worker.
	if r := s.snapctlEnv([]string{"SNAPCOORD_RUN_ID=grpo-42", "SNAPCOORD_RUN_TOKEN=" + tok}, "sidecar", "--name", "env-0", "--on-snapshot", "true"); r.code != exitAuth {
		t.Errorf("sidecar with the earlier token: exit %d, want %d (%s)", r.code, exitAuth, r.stderr)
	}
	s.sidecar("grpo-42", m[1], "--on-snapshot", "true")
	var workers v1.ListWorkersResponse
	s.getJSON(&workers, "workers", "grpo-42")
	if w := workers.GetWorkers(); len(w) != 1 || w[0].GetName() != "env-0" || w[0].GetIncarnation() != 2 {
		t.Errorf("workers %v, want env-0 alone, incarnation 2", w)
	}
	if out := s.ok("events", "grpo-42"); !strings.Contains(out, "run token reissued: job 42 requeued, restart 1") {
		t.Errorf("events do not record the reissued token:\n%s", out)
	}
	var resp v1.ReissueRunTokenResponse
	s.getJSON(&resp, "run", "reissue-token", "grpo-42")
	if resp.GetRunToken() == "" || resp.GetRunToken() == m[1] || resp.GetRun().GetRunId() != "grpo-42" {
		t.Errorf("-o json: %v, want the run and a new token", &resp)
	}

	// Not for a run that is over, nor for a run that does not exist.
	s.ok("run", "cancel", "grpo-42")
	s.wantExit(exitConflict, "run", "reissue-token", "grpo-42")
	s.wantExit(exitNotFound, "run", "reissue-token", "grpo-43")
}

// Every duration flag reads one grammar: Go durations, Slurm's times,
// DD:HH:MM:SS, and bare seconds where the flag counted seconds before. The
// budget reaches the coordinator as DD:HH:MM:SS.
func TestDurationFlags(t *testing.T) {
	t.Parallel() // snapctl's output only: no timing to disturb
	s := startServer(t)
	var run v1.Run
	s.createRun("go", "--world-size", "1", "--budget", "3h45m")
	s.getJSON(&run, "run", "get", "go")
	if got := run.GetSpec().GetCheckpointing().GetCheckpointMustSaveBy(); got != "00:03:45:00" {
		t.Errorf("--budget 3h45m sent as %q, want 00:03:45:00", got)
	}

	s.createRun("slurm", "--world-size", "1", "--budget", "1-12:00:00", "--target-level", "turn",
		"--margin", "1m30s", "--snapshot-interval", "5m", "--snapshot-timeout", "600",
		"--expected-checkpoint", "00:00:02:00", "--expected-snapshot", "0.5")
	s.getJSON(&run, "run", "get", "slurm")
	spec := run.GetSpec()
	if got := spec.GetCheckpointing().GetCheckpointMustSaveBy(); got != "01:12:00:00" {
		t.Errorf("--budget 1-12:00:00 sent as %q, want 01:12:00:00", got)
	}
	res, rc := spec.GetReserve(), spec.GetRolloutCheckpointing()
	if res.GetMarginSeconds() != 90 || res.GetExpectedCheckpointSeconds() != 120 || res.GetExpectedSnapshotSeconds() != 0.5 ||
		rc.GetSnapshotAttemptIntervalS() != 300 || rc.GetSnapshotTimeoutS() != 600 {
		t.Errorf("durations in seconds: margin %v, expected checkpoint %v, snapshot %v, interval %v, timeout %v; want 90, 120, 0.5, 300, 600",
			res.GetMarginSeconds(), res.GetExpectedCheckpointSeconds(), res.GetExpectedSnapshotSeconds(),
			rc.GetSnapshotAttemptIntervalS(), rc.GetSnapshotTimeoutS())
	}

	// --add in Slurm's D-HH, and negative.
	b := run.GetDeadline().GetMustSaveBy().AsTime()
	s.ok("run", "extend", "slurm", "--add", "2-00")
	s.ok("run", "extend", "slurm", "--add", "-30m")
	s.getJSON(&run, "run", "get", "slurm")
	if got, want := run.GetDeadline().GetMustSaveBy().AsTime(), b.Add(48*time.Hour-30*time.Minute); !got.Equal(want) {
		t.Errorf("after --add 2-00 and --add -30m, B = %v, want %v", got, want)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		// Slurm reads a bare 30 as minutes, Go refuses it: ask.
		{[]string{"--budget", "30"}, "write 30s or 30m"},
		{[]string{"--budget", "3 hours"}, "want a Go duration (3h45m, 30s), Slurm's [D-]HH:MM:SS (1-12:00:00"},
		{[]string{"--margin", "soon"}, "or a number of seconds (90)"},
		{[]string{"--snapshot-interval", "1.5"}, "must be whole seconds"},
		{[]string{"--budget", "1.5s"}, "must be whole seconds"},
		{[]string{"--margin", "-5"}, "must not be negative"},
		// A budget of 0 would create a run already past its deadline.
		{[]string{"--budget", "0"}, "--budget must be positive"},
		{[]string{"--budget", "00:00:00:00"}, "--budget must be positive"},
		{[]string{"--budget", "-1h"}, "must not be negative"},
	} {
		args := append([]string{"run", "create", "bad", "--world-size", "1"}, tc.args...)
		r := s.wantExit(exitUsage, args...)
		if !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, tc.args[0]) {
			t.Errorf("snapctl %v: stderr %q, want it to name %s and say %q", args, r.stderr, tc.args[0], tc.want)
		}
	}
	if r := s.snapctlEnv([]string{"SNAPCOORD_TIMEOUT=0:30"}, "run", "get", "go"); r.code != 0 {
		t.Errorf("SNAPCOORD_TIMEOUT=0:30 (MM:SS): exit %d: %s", r.code, r.stderr)
	}
	s.wantExit(exitNotFound, "run", "get", "bad") // nothing was created
	if r := s.wantExit(exitUsage, "run", "extend", "go", "--budget", "0s"); !strings.Contains(r.stderr, "--budget must be positive") {
		t.Errorf("run extend --budget 0s: stderr %q, want it to name --budget", r.stderr)
	}
	if got := s.getRun("go").GetSpec().GetCheckpointing().GetCheckpointMustSaveBy(); got != "00:03:45:00" {
		t.Errorf("after a refused run extend --budget 0s, the budget is %q, want 00:03:45:00 still", got)
	}
}

func isDuration(v any) bool {
	_, ok := v.(time.Duration)
	return ok
}

// Every duration flag of every command reads the common grammar
// (cmd/internal/durations), none the flag package's Go-only one.
func TestEveryDurationFlagTakesTheGrammar(t *testing.T) {
	for _, cmd := range commands {
		c := &cli{env: env{lookup: func(string) (string, bool) { return "", false }}, setFlags: map[string]bool{}}
		fs := c.newFlagSet("snapctl " + cmd.name)
		cmd.setup(fs, c)
		fs.VisitAll(func(f *flag.Flag) {
			if g, ok := f.Value.(flag.Getter); ok && isDuration(g.Get()) {
				t.Errorf("snapctl %s --%s is a flag.Duration: it refuses 00:10:00 and 1-00:00:00", cmd.name, f.Name)
			}
		})
	}
}
