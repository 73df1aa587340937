package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

// trainer registers rank 0 of runID through the Go client.
func (s *server) trainer(runID, token string) *client.Trainer {
	s.t.Helper()
	cl, err := client.Dial(s.addr, client.WithInsecure(), client.WithRunToken(token))
	if err != nil {
		s.t.Fatalf("Dial: %v", err)
	}
	s.t.Cleanup(func() { _ = cl.Close() })
	tr, err := cl.StartTrainer(s.t.Context(), client.TrainerConfig{RunID: runID, Rank: 0})
	if err != nil {
		s.t.Fatalf("StartTrainer: %v", err)
	}
	s.t.Cleanup(func() { _ = tr.Close(s.t.Context()) })
	return tr
}

func completeStep(t *testing.T, tr *client.Trainer, step int64, iter time.Duration, want v1.StepAction) {
	t.Helper()
	d, err := tr.CompleteStep(t.Context(), step, iter)
	if err != nil || d.GetAction() != want {
		t.Fatalf("CompleteStep(%d) = %v, %v; want %v", step, d.GetAction(), err, want)
	}
}

func TestExplain(t *testing.T) {
	s := startServer(t)
	tok := s.createRun("r1", "--world-size", "1", "--budget", "00:01:00:00",
		"--expected-checkpoint", "120", "--expected-snapshot", "60", "--margin", "30")
	if out := s.ok("run", "explain", "r1"); !strings.Contains(out, "no step has been decided") {
		t.Errorf("explain before any step:\n%s", out)
	}
	tr := s.trainer("r1", tok)
	completeStep(t, tr, 1, 41*time.Second, v1.StepAction_STEP_ACTION_CONTINUE)

	out := s.ok("run", "explain", "r1")
	continued := regexp.MustCompile(`continued: 41 s \+ 120 s \+ 60 s \+ 30 s would end at \d\d:\d\d:\d\d CET, 5[45] min before the deadline \(B = \d\d:\d\d:\d\d CET\)`)
	if !continued.MatchString(out) {
		t.Errorf("explain after step 1 does not say %q:\n%s", continued, out)
	}
	for _, want := range []string{"step 1", "I      41 s", "C     120 s", "Coordinator: now+I+C+R+M"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}

	s.ok("run", "trigger", "r1", "--reason", "node drain")
	completeStep(t, tr, 2, 41*time.Second, v1.StepAction_STEP_ACTION_SAVE_AND_STOP)
	if out := s.ok("run", "explain", "r1"); !strings.Contains(out, "step 2") || !strings.Contains(out, "saved and stopped: deadline triggered by hand (node drain)") {
		t.Errorf("explain after a manual trigger:\n%s", out)
	}
	if out := s.ok("run", "explain", "r1", "--step", "1"); !continued.MatchString(out) {
		t.Errorf("explain --step 1:\n%s", out)
	}
	var d v1.Decision
	s.getJSON(&d, "run", "explain", "r1", "--step", "2")
	if d.GetStep() != 2 || d.GetAction() != v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
		t.Errorf("explain -o json = %v", &d)
	}
}

// The rule fires: one more iteration and the save would end past B.
func TestExplainFiredByTheRule(t *testing.T) {
	s := startServer(t)
	tok := s.createRun("r1", "--world-size", "1", "--budget", "00:00:01:00")
	tr := s.trainer("r1", tok)
	completeStep(t, tr, 1, 2*time.Minute, v1.StepAction_STEP_ACTION_SAVE_AND_STOP)
	out := s.ok("run", "explain", "r1")
	fired := regexp.MustCompile(`saved and stopped: another step, then the save \(120 s \+ 0 s \+ 0 s \+ 0 s\), would end at \d\d:\d\d:\d\d CET, 1 min( \d+ s)? past the deadline`)
	if !fired.MatchString(out) {
		t.Errorf("explain does not say %q:\n%s", fired, out)
	}
	if !strings.Contains(out, "the deadline fired") {
		t.Errorf("explain does not say the deadline fired:\n%s", out)
	}
}

// A trigger after the first step waits for the next step, which saves and
// stops whatever fires_at says: get and explain must say so, not repeat
// "fires at ..." and the last "continued".
func TestTriggerPendingShown(t *testing.T) {
	s := startServer(t)
	tok := s.createRun("r1", "--world-size", "1", "--budget", "00:01:00:00")
	tr := s.trainer("r1", tok)
	completeStep(t, tr, 1, time.Second, v1.StepAction_STEP_ACTION_CONTINUE)

	pending := "the next completed step, which saves and stops: the deadline was triggered by hand (node drain)"
	for _, args := range [][]string{{"run", "trigger", "r1", "--reason", "node drain"}, {"run", "get", "r1"}} {
		if out := s.ok(args...); !strings.Contains(out, pending) || strings.Contains(out, "from then on") {
			t.Errorf("snapctl %v does not say %q (alone):\n%s", args, pending, out)
		}
	}
	now := "Now: the deadline was triggered by hand (node drain): the next completed step saves and stops."
	if out := s.ok("run", "explain", "r1"); !strings.Contains(out, now) {
		t.Errorf("explain after a trigger does not say %q:\n%s", now, out)
	}

	completeStep(t, tr, 2, time.Second, v1.StepAction_STEP_ACTION_SAVE_AND_STOP)
	if out := s.ok("run", "get", "r1"); strings.Contains(out, pending) || !strings.Contains(out, "by hand, at step 2") {
		t.Errorf("run get once step 2 fired the deadline:\n%s", out)
	}
}
