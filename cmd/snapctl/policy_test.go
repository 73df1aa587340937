package main

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// run create takes the policy, τ and the regular saves; run get and explain
// show the policy, its worst cases, what fires_at means under it and the
// losses a decision weighed.
func TestRunCreateExpectedLoss(t *testing.T) {
	s := startServer(t)
	tok := s.createRun("el", "--world-size", "1", "--budget", "00:00:01:00", "--policy", "expected-loss",
		"--max-loss", "10m", "--checkpoint-every", "5", "--safety-saves", "--expected-checkpoint", "10", "--expected-snapshot", "5", "--margin", "1")
	var run v1.Run
	s.getJSON(&run, "run", "get", "el")
	res := run.GetSpec().GetReserve()
	if res.GetPolicy() != v1.ReservePolicy_RESERVE_POLICY_EXPECTED_LOSS || res.GetMaxLossSeconds() != 600 || !res.GetSafetySaves() ||
		run.GetSpec().GetCheckpointing().GetCheckpointEverySteps() != 5 {
		t.Fatalf("spec %v, want EXPECTED_LOSS, τ 600 s, checkpoint_every_steps 5", run.GetSpec())
	}
	out := s.ok("run", "get", "el")
	for _, want := range []string{"expected loss, τ 10 min, with safety saves", "at their longest: I 0 s, C 25 s", "no step completing before then saves and stops; one completing later may", "last durable save"} {
		if !strings.Contains(out, want) {
			t.Errorf("run get lacks %q:\n%s", want, out)
		}
	}
	if out := s.ok("run", "explain", "el"); !strings.Contains(out, "(the policy's worst cases), no step completing before") {
		t.Errorf("explain before any step:\n%s", out)
	}

	// One step of 20 s: at most 22 s, and the save at most 25 + 12.5 s,
	// do not fit in the 59 s left before B - M, so the losses are weighed.
	tr := s.trainer("el", tok)
	if _, err := tr.CompleteStep(t.Context(), 1, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	out = s.ok("run", "explain", "el")
	for _, want := range []string{"saving now: expected loss", "expected loss: saving now", "Rule (expected loss)", "the last durable save"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}

	s.createRun("max", "--world-size", "1", "--budget", "1h")
	if out := s.ok("run", "get", "max"); !strings.Contains(out, "max (the default)") || strings.Contains(out, "last durable save") {
		t.Errorf("run get of a Max run:\n%s", out)
	}
}

func TestRunCreatePolicyErrors(t *testing.T) {
	s := startServer(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--policy", "quantile"}, exitInvalid, `--policy: "quantile" is not a policy (max, expected-loss)`},
		{[]string{"--policy", "expected-loss", "--max-loss", "600"}, exitUsage, "--max-loss"},
		{[]string{"--max-loss", "10m"}, exitInvalid, "spec.reserve.max_loss_seconds"},
		{[]string{"--checkpoint-every", "-1"}, exitInvalid, "checkpoint_every_steps"},
		{[]string{"--safety-saves"}, exitInvalid, "spec.reserve.safety_saves"},
	} {
		args := append([]string{"run", "create", "bad", "--world-size", "1", "--budget", "1h"}, tc.args...)
		if r := s.wantExit(tc.code, args...); !strings.Contains(r.stderr, tc.want) {
			t.Errorf("snapctl %v: stderr %q, want %q", args, r.stderr, tc.want)
		}
	}
}

// --from-nemo-rl reads checkpointing.save_period as the regular saves, and
// none when checkpointing is disabled.
func TestRunCreateNemoRLSavePeriod(t *testing.T) {
	t.Parallel() // snapctl's output only: no timing to disturb
	s := startServer(t)
	var run v1.Run
	s.createRun("on", "--from-nemo-rl", writeFile(t, "on.yaml", nemoRLYAML), "--world-size", "1")
	s.getJSON(&run, "run", "get", "on")
	if got := run.GetSpec().GetCheckpointing().GetCheckpointEverySteps(); got != 10 {
		t.Errorf("save_period 10: checkpoint_every_steps %d", got)
	}
	off := strings.Replace(nemoRLYAML, "enabled: true", "enabled: false", 1)
	s.createRun("off", "--from-nemo-rl", writeFile(t, "off.yaml", off), "--world-size", "1")
	s.getJSON(&run, "run", "get", "off")
	if got := run.GetSpec().GetCheckpointing().GetCheckpointEverySteps(); got != 0 {
		t.Errorf("checkpointing disabled: checkpoint_every_steps %d, want 0", got)
	}
	s.createRun("flag", "--from-nemo-rl", writeFile(t, "flag.yaml", nemoRLYAML), "--world-size", "1", "--checkpoint-every", "3")
	s.getJSON(&run, "run", "get", "flag")
	if got := run.GetSpec().GetCheckpointing().GetCheckpointEverySteps(); got != 3 {
		t.Errorf("--checkpoint-every 3 over save_period 10: %d", got)
	}
}
