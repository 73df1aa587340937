package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
)

// A run whose B had passed before its first step: the step is decided
// late, and run get and run watch say DEADLINE MISSED, with the reason.
func TestDeadlineMissedShown(t *testing.T) {
	s := startServer(t)
	started := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	tok := s.createRun("r1", "--world-size", "1", "--started-at", started, "--budget", "00:00:30:00")
	if out := s.ok("run", "get", "r1"); strings.Contains(out, "DEADLINE MISSED") || !regexp.MustCompile(`regular saves +none declared`).MatchString(out) {
		t.Errorf("run get before any step:\n%s", out)
	}
	tr := s.trainer("r1", tok)
	completeStep(t, tr, 1, time.Second, v1.StepAction_STEP_ACTION_SAVE_AND_STOP)

	out := s.ok("run", "get", "r1")
	if !regexp.MustCompile(`DEADLINE MISSED +step 1 was decided at `).MatchString(out) || !strings.Contains(out, "after B = ") {
		t.Errorf("run get after a step decided past B:\n%s", out)
	}
	var run v1.Run
	s.getJSON(&run, "run", "get", "r1")
	if !run.GetDeadlineMissed() || run.GetDeadlineMissedAt() == nil || !strings.HasPrefix(run.GetDeadlineMissedReason(), "step 1 was decided") {
		t.Errorf("run get -o json: deadline_missed %v at %v, %q", run.GetDeadlineMissed(), run.GetDeadlineMissedAt(), run.GetDeadlineMissedReason())
	}

	if _, err := tr.ReportCheckpoint(t.Context(), 1, v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, time.Second); err != nil {
		t.Fatal(err)
	}
	out = s.ok("run", "watch", "r1")
	for _, want := range []string{"ended STOPPED", "DEADLINE MISSED: step 1 was decided at "} {
		if !strings.Contains(out, want) {
			t.Errorf("run watch lacks %q:\n%s", want, out)
		}
	}
}

// A run with checkpoint_every_steps (set through the API: no run create
// flag yet) whose step 2 is followed by a regular save: run get shows S for
// the next step, and run explain puts S in the sum and its own line.
func TestRegularSaveShown(t *testing.T) {
	s := startServer(t)
	cl, err := client.Dial(s.addr, client.WithInsecure(), client.WithToken(adminToken))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	spec := spectest.Checkpointed(1, "00:01:00:00")
	spec.Checkpointing.CheckpointEverySteps = 2
	spec.Reserve = &v1.ReserveSpec{ExpectedCheckpointSeconds: proto.Float64(120), MarginSeconds: 30}
	resp, err := cl.Runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "r1", Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	tr := s.trainer("r1", resp.GetRunToken())
	completeStep(t, tr, 1, 41*time.Second, v1.StepAction_STEP_ACTION_CONTINUE)
	out := s.ok("run", "get", "r1")
	for _, want := range []string{"multiple of 2", "S 120 s (the regular save after step 2)"} {
		if !strings.Contains(out, want) {
			t.Errorf("run get lacks %q:\n%s", want, out)
		}
	}
	completeStep(t, tr, 2, 41*time.Second, v1.StepAction_STEP_ACTION_CONTINUE)
	out = s.ok("run", "explain", "r1")
	continued := regexp.MustCompile(`continued: 120 s \+ 41 s \+ 120 s \+ 0 s \+ 30 s would end at \d\d:\d\d:\d\d CET, 5[45] min before the deadline`)
	if !continued.MatchString(out) || !regexp.MustCompile(`S +120 s +the regular save after this step`).MatchString(out) ||
		!strings.Contains(out, "Coordinator: now+S+I+C+R+M") {
		t.Errorf("run explain of step 2:\n%s", out)
	}
}
