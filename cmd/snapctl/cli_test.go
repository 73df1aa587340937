package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
)

// A time of day in Paris: the tests run snapctl with TZ=Europe/Paris.
var parisTime = regexp.MustCompile(`\d\d:\d\d:\d\d (CET|CEST)`)

func TestRunCommands(t *testing.T) {
	t.Parallel() // snapctl's output only: no timing to disturb
	s := startServer(t)
	s.createRun("r1", "--world-size", "2", "--budget", "00:01:00:00", "--target-level", "turn", "--margin", "30")

	out := s.ok("run", "get", "r1")
	for _, want := range []string{"PENDING", "turn", "M 30 s", "B = "} {
		if !strings.Contains(out, want) {
			t.Errorf("run get: %q missing from\n%s", want, out)
		}
	}
	if !parisTime.MatchString(out) {
		t.Errorf("run get shows no local time with its zone:\n%s", out)
	}
	var run v1.Run
	s.getJSON(&run, "run", "get", "r1")
	if run.GetRunId() != "r1" || run.GetSpec().GetTrainerWorldSize() != 2 {
		t.Errorf("run get -o json = %v", &run)
	}
	if out := s.ok("run", "list"); !strings.Contains(out, "r1") || !strings.Contains(out, "PENDING") {
		t.Errorf("run list:\n%s", out)
	}

	// extend moves B; --add is relative to the current B.
	b := run.GetDeadline().GetMustSaveBy().AsTime()
	s.ok("run", "extend", "r1", "--add", "30m")
	s.getJSON(&run, "run", "get", "r1")
	if got := run.GetDeadline().GetMustSaveBy().AsTime(); !got.Equal(b.Add(30 * time.Minute)) {
		t.Errorf("after extend --add 30m, B = %v, want %v", got, b.Add(30*time.Minute))
	}
	s.ok("run", "extend", "r1", "--budget", "00:02:00:00")
	s.getJSON(&run, "run", "get", "r1")
	if got := run.GetDeadline().GetMustSaveBy().AsTime(); !got.Equal(b.Add(time.Hour)) {
		t.Errorf("after extend --budget 00:02:00:00, B = %v, want %v", got, b.Add(time.Hour))
	}

	// Fired before the first step with no environment worker: the deadline
	// snapshot has nobody to wait for and the run stops.
	s.ok("run", "trigger", "r1", "--reason", "maintenance")
	s.getJSON(&run, "run", "get", "r1")
	if run.GetState() != v1.RunState_RUN_STATE_STOPPED || run.GetFireKind() != v1.DeadlineFireKind_DEADLINE_FIRE_KIND_MANUAL {
		t.Errorf("after trigger: %v fired %v, want STOPPED by hand", run.GetState(), run.GetFireKind())
	}
	if out := s.ok("events", "r1"); !strings.Contains(out, "deadline_fired") || !strings.Contains(out, "maintenance") || !parisTime.MatchString(out) {
		t.Errorf("events:\n%s", out)
	}
	for _, line := range strings.Split(strings.TrimSpace(s.ok("events", "r1", "-o", "json")), "\n") {
		var ev v1.RunEvent
		if err := protojson.Unmarshal([]byte(line), &ev); err != nil || ev.GetSeq() == 0 {
			t.Errorf("events -o json line %q: %v", line, err)
		}
	}
	if out := s.ok("snapshots", "r1"); !strings.Contains(out, "deadline") || !strings.Contains(out, "SKIPPED") {
		t.Errorf("snapshots:\n%s", out)
	}
	var snaps v1.ListSnapshotsResponse
	s.getJSON(&snaps, "snapshots", "r1")
	if len(snaps.GetSnapshots()) != 1 || !snaps.GetSnapshots()[0].GetForced() {
		t.Errorf("snapshots -o json = %v, want one forced snapshot", &snaps)
	}
	if out := s.ok("run", "watch", "r1"); !strings.Contains(out, "ended STOPPED") {
		t.Errorf("run watch of a stopped run:\n%s", out)
	}
	if out := s.ok("workers", "r1"); !strings.HasPrefix(out, "ID") {
		t.Errorf("workers:\n%s", out)
	}

	s.createRun("r2", "--world-size", "1")
	s.ok("run", "cancel", "r2", "--reason", "wrong config")
	s.ok("run", "cancel", "r2") // cancelling a cancelled run is fine
	if r := s.wantExit(exitRunFailed, "run", "watch", "r2"); !strings.Contains(r.stdout, "ended CANCELLED") {
		t.Errorf("run watch of a cancelled run:\n%s", r.stdout)
	}
	var list v1.ListRunsResponse
	s.getJSON(&list, "run", "list", "--state", "cancelled")
	if len(list.GetRuns()) != 1 || list.GetRuns()[0].GetRunId() != "r2" {
		t.Errorf("run list --state cancelled -o json = %v", &list)
	}
}

func TestExitStatuses(t *testing.T) {
	s := startServer(t)
	s.createRun("r1", "--world-size", "1", "--budget", "00:01:00:00")
	for _, tc := range []struct {
		name string
		code int
		env  []string
		args []string
	}{
		{"no command", exitUsage, nil, nil},
		{"unknown command", exitUsage, nil, []string{"run", "frobnicate", "r1"}},
		{"unknown flag", exitUsage, nil, []string{"run", "get", "r1", "--bogus"}},
		{"missing argument", exitUsage, nil, []string{"run", "get"}},
		{"no world size", exitUsage, nil, []string{"run", "create", "r9"}},
		{"bad output format", exitUsage, nil, []string{"run", "get", "r1", "-o", "yaml"}},
		{"extend needs one change", exitUsage, nil, []string{"run", "extend", "r1", "--add", "1m", "--budget", "00:01:00:00"}},
		{"sidecar without a hook", exitUsage, nil, []string{"sidecar", "--run", "r1"}},
		{"unknown run", exitNotFound, nil, []string{"run", "get", "nope"}},
		{"no such step", exitNotFound, nil, []string{"run", "explain", "r1", "--step", "7"}},
		{"same run again, no worker yet: a new token", exitOK, nil, []string{"run", "create", "r1", "--world-size", "1", "--budget", "00:01:00:00"}},
		{"same id, other spec", exitConflict, nil, []string{"run", "create", "r1", "--world-size", "2"}},
		{"coordinator unreachable", exitUnavailable, []string{"SNAPCOORD_ADDR=127.0.0.1:1"}, []string{"run", "get", "r1", "--timeout", "1s"}},
		{"no admin token", exitAuth, []string{"SNAPCOORD_TOKEN="}, []string{"run", "get", "r1"}},
		{"wrong admin token", exitAuth, nil, []string{"run", "get", "r1", "--token", "wrong"}},
		{"bad budget", exitUsage, nil, []string{"run", "create", "r9", "--world-size", "1", "--budget", "3 hours"}},
		{"bad target level", exitInvalid, nil, []string{"run", "create", "r9", "--world-size", "1", "--target-level", "rollout"}},
		{"bad time", exitInvalid, nil, []string{"run", "create", "r9", "--world-size", "1", "--must-save-by", "tomorrow"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := s.snapctlEnv(tc.env, tc.args...)
			if r.code != tc.code {
				t.Errorf("snapctl %v: exit %d, want %d\nstderr: %s", tc.args, r.code, tc.code, r.stderr)
			}
			if tc.code != 0 && !strings.HasPrefix(r.stderr, "snapctl: ") && len(tc.args) > 0 {
				t.Errorf("stderr %q: want one line starting with \"snapctl: \"", r.stderr)
			}
		})
	}
}

func TestHelpListsExitStatuses(t *testing.T) {
	s := startServer(t)
	out := s.ok("help")
	for _, want := range []string{"run create", "sidecar", "Exit status:", "SNAPCOORD_TOKEN_FILE", "10  sidecar"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	if out := s.ok("run", "create", "--help"); !strings.Contains(out, "--from-nemo-rl") {
		t.Errorf("run create --help:\n%s", out)
	}
}

// --version and version print the version and commit and exit 0, also
// with connection flags before them.
func TestVersion(t *testing.T) {
	s := startServer(t)
	for _, args := range [][]string{{"--version"}, {"version"}, {"--addr", "127.0.0.1:1", "--version"}} {
		if out := s.ok(args...); !strings.HasPrefix(out, "snapctl ") || !strings.Contains(out, " (commit ") || !strings.Contains(out, ", go1.") {
			t.Errorf("snapctl %v = %q, want \"snapctl VERSION (commit COMMIT, GOVERSION)\"", args, out)
		}
	}
}

// oneDashFlag finds "-budget" (as Go's flag package prints flags) but not
// "--budget", "-o" or "slurm-10m".
var oneDashFlag = regexp.MustCompile(`(^|[\s(\[,'"])-[a-z][a-z-]+`)

// Help and errors write every flag with two dashes, as docs/snapctl.md does.
func TestHelpAndErrorsUseTwoDashes(t *testing.T) {
	t.Parallel() // snapctl's output only: no timing to disturb
	s := startServer(t)
	helps := [][]string{{"help"}, {"--help"}}
	for _, c := range commands {
		helps = append(helps, append(strings.Fields(c.name), "--help"))
	}
	for _, args := range helps {
		out := s.ok(args...)
		if m := oneDashFlag.FindString(out); m != "" {
			t.Errorf("snapctl %s shows a flag with one dash (%q):\n%s", strings.Join(args, " "), m, out)
		}
	}
	for _, args := range [][]string{{"run", "get", "r1", "--bogus"}, {"-timeout=soon", "run", "list"}, {"run", "create", "r1", "--world-size", "x"}} {
		r := s.wantExit(exitUsage, args...)
		if first, _, _ := strings.Cut(r.stderr, "\n"); !strings.Contains(first, " --") || oneDashFlag.MatchString(first) {
			t.Errorf("snapctl %s: error %q, want the flag named with two dashes", strings.Join(args, " "), first)
		}
	}
	var run v1.Run
	s.createRun("r1", "--world-size", "1")
	s.getJSON(&run, "run", "get", "r1") // -o json
	if out := s.ok("run", "get", "r1", "--output", "json"); !strings.Contains(out, `"run_id": "r1"`) {
		t.Errorf("run get --output json:\n%s", out)
	}
}

// A token file, with the trailing newline editors add.
func TestTokenFile(t *testing.T) {
	t.Parallel() // snapctl's output only: no timing to disturb
	s := startServer(t)
	file := writeFile(t, "admin.token", adminToken+"\n")
	s.createRun("r1", "--world-size", "1")
	if r := s.snapctlEnv([]string{"SNAPCOORD_TOKEN=", "SNAPCOORD_TOKEN_FILE=" + file}, "run", "get", "r1"); r.code != 0 {
		t.Errorf("run get with SNAPCOORD_TOKEN_FILE: exit %d: %s", r.code, r.stderr)
	}
	if r := s.snapctlEnv([]string{"SNAPCOORD_TOKEN="}, "--token-file", file, "run", "get", "r1"); r.code != 0 {
		t.Errorf("run get --token-file: exit %d: %s", r.code, r.stderr)
	}
}

func TestCreateJSONCarriesToken(t *testing.T) {
	s := startServer(t)
	var resp struct {
		Run struct {
			RunID string `json:"run_id"`
		} `json:"run"`
		RunToken string `json:"run_token"`
	}
	out := s.ok("run", "create", "r1", "--world-size", "1", "-o", "json")
	if err := json.Unmarshal([]byte(out), &resp); err != nil || resp.RunToken == "" || resp.Run.RunID != "r1" {
		t.Errorf("run create -o json = %q (%v), want the run and its token", out, err)
	}
}

// A watch stopped by a signal has not seen the run end. Exit 0 would tell
// `snapctl run watch $RUN && mark_done` that it ended STOPPED or COMPLETED.
func TestWatchInterrupted(t *testing.T) {
	s := startServer(t)
	s.createRun("r1", "--world-size", "1", "--budget", "00:01:00:00")
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		p := startProc(t, s.env(), bin.snapctl, "run", "watch", "r1")
		// main catches both signals from its first line on.
		p.waitFor(t, "the watch to start", func(out string) bool { return strings.Contains(out, "run r1 is PENDING") })
		if err := p.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if code := p.exitCode(t); code != exitInterrupted || !strings.Contains(p.out.String(), "snapctl: interrupted before run r1") {
			t.Errorf("run watch of a PENDING run, sent %v: exit %d, want %d:\n%s", sig, code, exitInterrupted, p.out.String())
		}
	}
}

// -o json prints every field, zero values too: a script reading rank 0 or
// last_step 0 must find the key rather than guess that absent means 0.
func TestJSONShowsZeroValues(t *testing.T) {
	s := startServer(t)
	tok := s.createRun("r1", "--world-size", "1", "--budget", "00:01:00:00")
	s.trainer("r1", tok) // rank 0
	for _, tc := range []struct {
		args []string
		keys []string
	}{
		{[]string{"run", "get", "r1"}, []string{"last_step", "last_published_step", "failure_message"}},
		{[]string{"workers", "r1"}, []string{"workers.0.rank"}},
		{[]string{"snapshots", "r1"}, []string{"snapshots"}},
	} {
		var obj map[string]any
		if err := json.Unmarshal([]byte(s.ok(append(tc.args, "-o", "json")...)), &obj); err != nil {
			t.Fatalf("%v -o json: %v", tc.args, err)
		}
		for _, key := range tc.keys {
			if !hasKey(obj, key) {
				t.Errorf("%v -o json has no %q: %v", tc.args, key, obj)
			}
		}
	}
	// One object per line, each with step (0 before any step).
	for _, line := range strings.Split(strings.TrimSpace(s.ok("events", "r1", "-o", "json")), "\n") {
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil || !hasKey(ev, "step") {
			t.Errorf("events -o json line %q: %v, want an object with step", line, err)
		}
	}
}

// hasKey follows a dotted path ("workers.0.rank") through decoded JSON.
func hasKey(v any, path string) bool {
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[k]; !ok {
				return false
			}
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i >= len(x) {
				return false
			}
			v = x[i]
		default:
			return false
		}
	}
	return true
}

// runAtStep2 is a server with run r1 RUNNING, steps 1 and 2 decided,
// and the trainer that stepped it.
func runAtStep2(t *testing.T) (*server, *client.Trainer) {
	t.Helper()
	s := startServer(t)
	tok := s.createRun("r1", "--world-size", "1", "--budget", "1h", "--margin", "30")
	tr := s.trainer("r1", tok)
	completeStep(t, tr, 1, time.Second, v1.StepAction_STEP_ACTION_CONTINUE)
	completeStep(t, tr, 2, time.Second, v1.StepAction_STEP_ACTION_CONTINUE)
	return s, tr
}

// run watch --from-now starts with where the run stands, its state and
// last decision, then follows; a run that has ended gets no countdown to B.
func TestWatchFromNowStartsWithStateAndLastDecision(t *testing.T) {
	s, tr := runAtStep2(t)

	p := startProc(t, s.env(), bin.snapctl, "run", "watch", "r1", "--from-now")
	p.waitFor(t, "the watch to show the run", func(out string) bool { return strings.Contains(out, "last decision, step 2 at ") })
	if strings.Contains(p.out.String(), "step 1") {
		t.Errorf("run watch --from-now printed history (step 1):\n%s", p.out.String())
	}
	head := p.out.String()
	for _, want := range []string{"run r1 is RUNNING at step 2; B = ", " (in ", "last decision, step 2 at ", ": continued: "} {
		if !strings.Contains(head, want) {
			t.Errorf("run watch began without %q:\n%s", want, head)
		}
	}
	// Then it follows: the next decision and the end.
	completeStep(t, tr, 3, time.Second, v1.StepAction_STEP_ACTION_CONTINUE)
	p.waitFor(t, "step 3's decision", func(out string) bool { return strings.Contains(out, "step 3") && strings.Contains(out, "decision") })
	s.ok("run", "cancel", "r1", "--reason", "done watching")
	if code := p.exitCode(t); code != exitRunFailed || !strings.Contains(p.out.String(), "run r1 ended CANCELLED") {
		t.Errorf("run watch: exit %d, want %d after the cancel:\n%s", code, exitRunFailed, p.out.String())
	}

	// A run that has ended: its state, how its end stood to B, the last
	// decision, and no "in N min".
	r := s.wantExit(exitRunFailed, "run", "watch", "r1", "--from-now")
	for _, want := range []string{"run r1 is CANCELLED at step 3; B = ", "(the run ended ", " before B)", "last decision, step 3 at ", "run r1 ended CANCELLED"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("run watch of an ended run lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "(in ") {
		t.Errorf("run watch of an ended run counts down to B:\n%s", r.stdout)
	}
	if out := s.ok("run", "get", "r1"); strings.Contains(out, "(in ") || !strings.Contains(out, "before B)") {
		t.Errorf("run get of an ended run counts down to B:\n%s", out)
	}
}

// `snapctl run` alone lists run's commands (it said "unknown command");
// with --help on stdout, exit 0; with a wrong one, the error and the list.
func TestGroupAloneListsItsCommands(t *testing.T) {
	s := &server{t: t, addr: closedPort(t)} // nothing is called
	for _, tc := range []struct {
		args     []string
		code     int
		out, err string // where the list is, and the error
	}{
		{[]string{"run"}, exitUsage, "", ""},
		{[]string{"run", "--help"}, exitOK, "stdout", ""},
		{[]string{"run", "help"}, exitOK, "stdout", ""},
		{[]string{"run", "frobnicate"}, exitUsage, "", `unknown command "run frobnicate"`},
	} {
		r := s.wantExit(tc.code, tc.args...)
		list := r.stderr
		if tc.out == "stdout" {
			list = r.stdout
		}
		for _, want := range []string{"usage: snapctl run <command>", "run create ", "run watch ", "run reissue-token ", "snapctl run <command> --help"} {
			if !strings.Contains(list, want) {
				t.Errorf("snapctl %v: the list lacks %q:\nstdout: %s\nstderr: %s", tc.args, want, r.stdout, r.stderr)
			}
		}
		if strings.Contains(r.stderr, "unknown command") != (tc.err != "") || !strings.Contains(r.stderr, tc.err) {
			t.Errorf("snapctl %v: stderr %q, want the error %q only if given", tc.args, r.stderr, tc.err)
		}
	}
}

// Under -o json an error is JSON too: one object on one line on stderr
// (stdout holds results only), with the exit status and the gRPC code
// when the coordinator gave one; wherever -o is, even after a bad flag.
func TestErrorsAreJSONUnderOutputJSON(t *testing.T) {
	s := startServer(t)
	silent := &server{t: t, addr: silentPeer(t)}
	for _, tc := range []struct {
		s        *server
		args     []string
		code     int
		grpcCode string
		says     string
	}{
		{s, []string{"-o", "json", "run", "get", "nope"}, exitNotFound, "NotFound", `run "nope" not found`},
		{s, []string{"run", "get", "nope", "--output=json"}, exitNotFound, "NotFound", `run "nope" not found`},
		{s, []string{"--bogus", "-o", "json", "run", "list"}, exitUsage, "", "--bogus"},
		{s, []string{"-o", "json", "run"}, exitUsage, "", "run create, run get"},
		{s, []string{"run", "create", "r0", "--world-size", "1", "--budget", "0", "-o", "json"}, exitUsage, "", "--budget must be positive"},
		{s, []string{"--token", "wrong", "-o", "json", "run", "list"}, exitAuth, "Unauthenticated", "list runs"},
		{silent, []string{"-o", "json", "run", "list"}, exitUnavailable, "", "did not answer"},
	} {
		r := tc.s.snapctlEnv(noPlaintextEnv, tc.args...)
		if r.code != tc.code || r.stdout != "" {
			t.Errorf("snapctl %v: exit %d, stdout %q; want %d and nothing on stdout", tc.args, r.code, r.stdout, tc.code)
		}
		var e struct {
			Error      string `json:"error"`
			ExitStatus int    `json:"exit_status"`
			GRPCCode   string `json:"grpc_code"`
		}
		dec := json.NewDecoder(strings.NewReader(r.stderr))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("snapctl %v: stderr %q is not one JSON object on one line: %v", tc.args, r.stderr, err)
			continue
		}
		if e.ExitStatus != tc.code || e.GRPCCode != tc.grpcCode || !strings.Contains(e.Error, tc.says) || strings.HasPrefix(e.Error, "snapctl:") {
			t.Errorf("snapctl %v: %+v; want exit_status %d, grpc_code %q, an error saying %q", tc.args, e, tc.code, tc.grpcCode, tc.says)
		}
	}
	// The last -o wins, as for the output.
	if r := s.wantExit(exitNotFound, "-o", "json", "-o", "table", "run", "get", "nope"); !strings.HasPrefix(r.stderr, "snapctl: get run nope: NotFound") {
		t.Errorf("-o json -o table: stderr %q, want the text form", r.stderr)
	}
}

// run watch prints the run's history first, as events --follow does (it
// printed none: a watch started mid-run showed nothing of how it got
// there), then follows; -o json prints the same events as JSON lines.
func TestWatchPrintsHistoryFirst(t *testing.T) {
	s, tr := runAtStep2(t)
	history := s.ok("events", "r1")

	p := startProc(t, s.env(), bin.snapctl, "run", "watch", "r1")
	p.waitFor(t, "the history", func(out string) bool { return strings.Contains(out, history) })
	head := p.out.String()
	if !strings.HasPrefix(head, "run r1 is RUNNING at step 2; B = ") || !strings.Contains(head, "step 1") {
		t.Errorf("run watch began without the state and then the whole history (step 1 included):\n%s", head)
	}
	completeStep(t, tr, 3, time.Second, v1.StepAction_STEP_ACTION_CONTINUE)
	p.waitFor(t, "step 3's decision", func(out string) bool { return strings.Contains(out[len(head):], "step 3") })
	s.ok("run", "cancel", "r1", "--reason", "done watching")
	if code := p.exitCode(t); code != exitRunFailed || !strings.Contains(p.out.String(), "run r1 ended CANCELLED") {
		t.Errorf("run watch: exit %d, want %d after the cancel:\n%s", code, exitRunFailed, p.out.String())
	}

	// A run that has ended: its whole history, as JSON lines, and nothing else.
	events := strings.Split(strings.TrimSpace(s.ok("events", "r1", "-o", "json")), "\n")
	r := s.wantExit(exitRunFailed, "run", "watch", "r1", "-o", "json")
	if got := strings.Split(strings.TrimSpace(r.stdout), "\n"); strings.Join(got, "\n") != strings.Join(events, "\n") || len(got) < 5 {
		t.Errorf("run watch -o json of an ended run printed %d lines, want its %d events:\n%s", len(got), len(events), r.stdout)
	}
}
