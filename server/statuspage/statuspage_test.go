package statuspage_test

import (
	"context"
	"encoding/xml"
	"html/template"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
	"github.com/snapcoord/snapcoord/server/auth"
	"github.com/snapcoord/snapcoord/server/clock"
	"github.com/snapcoord/snapcoord/server/engine"
	"github.com/snapcoord/snapcoord/server/statuspage"
	"github.com/snapcoord/snapcoord/store"
)

const (
	adminToken  = "admin-0123456789abcdef0123456789"
	viewerToken = "viewer-0123456789abcdef012345678"
)

var start = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// world is a real engine on a real bbolt file, under a fake clock, with the
// status page in front of it.
type world struct {
	t        *testing.T
	clk      *clock.Fake
	eng      *engine.Engine
	page     http.Handler
	runToken string
	trainer  string
	env      string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	db, err := store.Open(filepath.Join(t.TempDir(), "snapcoord.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(start)
	eng, err := engine.New(context.Background(), db, engine.Options{Clock: clk, HeartbeatInterval: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		eng.Close()
		_ = db.Close()
	})
	authn, err := auth.New(auth.Options{AdminTokens: []string{adminToken}, ViewerTokens: []string{viewerToken}, Runs: eng})
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, clk: clk, eng: eng, page: statuspage.New(statuspage.Options{Runs: eng, Admit: authn, Now: clk.Now})}
}

// createRun makes run r: B in 10 minutes, C 60 s, R 30 s, M 30 s, one
// trainer rank and one environment worker.
func (w *world) createRun() {
	w.t.Helper()
	ctx := context.Background()
	spec := spectest.Turn(1, "00:00:10:00")
	spec.Reserve = &v1.ReserveSpec{MarginSeconds: 30, ExpectedCheckpointSeconds: proto.Float64(60), ExpectedSnapshotSeconds: proto.Float64(30)}
	resp, err := w.eng.CreateRun(ctx, &v1.CreateRunRequest{RunId: "r", Spec: spec})
	if err != nil {
		w.t.Fatalf("CreateRun: %v", err)
	}
	w.runToken = resp.GetRunToken()
	w.trainer = w.register(v1.WorkerRole_WORKER_ROLE_TRAINER, "rank-0")
	w.env = w.register(v1.WorkerRole_WORKER_ROLE_ENVIRONMENT, "env-0")
}

func (w *world) register(role v1.WorkerRole, name string) string {
	w.t.Helper()
	resp, err := w.eng.RegisterWorker(context.Background(), &v1.RegisterWorkerRequest{RunId: "r", Role: role, Name: name})
	if err != nil {
		w.t.Fatalf("RegisterWorker(%s): %v", name, err)
	}
	return resp.GetWorkerId()
}

// step lets 30 s pass (the workers heartbeating) and completes a step.
func (w *world) step(n int64) v1.StepAction {
	w.t.Helper()
	ctx := context.Background()
	w.clk.Advance(30 * time.Second)
	for _, id := range []string{w.trainer, w.env} {
		if _, err := w.eng.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: "r", WorkerId: id}); err != nil {
			w.t.Fatalf("Heartbeat: %v", err)
		}
	}
	resp, err := w.eng.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: "r", WorkerId: w.trainer, Step: n, IterationSeconds: 30})
	if err != nil {
		w.t.Fatalf("CompleteStep(%d): %v", n, err)
	}
	return resp.GetDecision().GetAction()
}

// saveAtDeadline saves the fired step's checkpoint and the deadline
// snapshot, 5 s and 10 s later: the run stops.
func (w *world) saveAtDeadline(step int64) {
	w.t.Helper()
	ctx := context.Background()
	w.clk.Advance(5 * time.Second)
	if _, err := w.eng.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{RunId: "r", WorkerId: w.trainer, Step: step,
		Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED, SaveSeconds: 5}); err != nil {
		w.t.Fatalf("ReportCheckpoint: %v", err)
	}
	poll, err := w.eng.PollCommands(ctx, &v1.PollCommandsRequest{RunId: "r", WorkerId: w.env, WaitSeconds: 10})
	if err != nil {
		w.t.Fatalf("PollCommands: %v", err)
	}
	var snap string
	for _, c := range poll.GetCommands() {
		if s := c.GetSaveAtDeadline(); s != nil {
			snap = s.GetSnapshotId()
		}
	}
	if snap == "" {
		w.t.Fatalf("no SaveAtDeadline for the environment worker: %v", poll.GetCommands())
	}
	w.clk.Advance(10 * time.Second)
	if _, err := w.eng.ReportSnapshot(ctx, &v1.ReportSnapshotRequest{RunId: "r", WorkerId: w.env, SnapshotId: snap,
		Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED, DurationSeconds: 10}); err != nil {
		w.t.Fatalf("ReportSnapshot: %v", err)
	}
}

// get fetches path with the given Authorization header (none if empty).
func (w *world) get(path, authorization string) (int, http.Header, string) {
	w.t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	rec := httptest.NewRecorder()
	w.page.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, rec.Result().Header, string(body)
}

func (w *world) admin(path string) string {
	w.t.Helper()
	code, _, body := w.get(path, "Bearer "+adminToken)
	if code != http.StatusOK {
		w.t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return body
}

// The page admits a viewer or an admin token, as a bearer token or as a
// basic-auth password; nothing else.
func TestStatusPageNeedsAViewerOrAdminToken(t *testing.T) {
	w := newWorld(t)
	w.createRun()
	basic := func(user, pass string) string {
		req, _ := http.NewRequest(http.MethodGet, "/", nil)
		req.SetBasicAuth(user, pass)
		return req.Header.Get("Authorization")
	}
	for _, tc := range []struct {
		name, authorization string
		want                int
	}{
		{"no credentials", "", http.StatusUnauthorized},
		{"a wrong token", "Bearer not-the-admin-token-at-all", http.StatusUnauthorized},
		{"a wrong basic password", basic("ops", "not-the-admin-token-at-all"), http.StatusUnauthorized},
		{"the run token", "Bearer " + w.runToken, http.StatusForbidden},
		{"the admin token", "Bearer " + adminToken, http.StatusOK},
		{"the admin token as basic password", basic("anyone", adminToken), http.StatusOK},
		{"the viewer token as basic password", basic("anyone", viewerToken), http.StatusOK},
		{"the viewer token", "Bearer " + viewerToken, http.StatusOK},
	} {
		for _, path := range []string{"/", "/runs/r"} {
			code, hdr, body := w.get(path, tc.authorization)
			if code != tc.want {
				t.Errorf("GET %s with %s: %d, want %d", path, tc.name, code, tc.want)
			}
			if code == http.StatusUnauthorized && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Basic ") {
				t.Errorf("GET %s with %s: 401 without a basic-auth challenge: %v", path, tc.name, hdr)
			}
			if code != http.StatusOK && strings.Contains(body, "<svg") {
				t.Errorf("GET %s with %s: refused but the page was sent", path, tc.name)
			}
		}
	}
}

func TestUnknownOrInvalidRunIsNotFound(t *testing.T) {
	w := newWorld(t)
	for _, path := range []string{"/runs/nope", "/runs/Not_A_Valid_Id"} {
		if code, _, _ := w.get(path, "Bearer "+adminToken); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, code)
		}
	}
}

// svgNode is any SVG element, with the attributes the test reads.
type svgNode struct {
	XMLName  xml.Name
	ID       string    `xml:"id,attr"`
	Class    string    `xml:"class,attr"`
	X        string    `xml:"x,attr"`
	X1       string    `xml:"x1,attr"`
	Title    string    `xml:"title"`
	Children []svgNode `xml:",any"`
}

// parseSVG parses the page's inline SVG, which is well-formed XML.
func parseSVG(t *testing.T, page string) svgNode {
	t.Helper()
	i, j := strings.Index(page, "<svg"), strings.Index(page, "</svg>")
	if i < 0 || j < i {
		t.Fatalf("no <svg> in the page:\n%s", page)
	}
	var root svgNode
	if err := xml.Unmarshal([]byte(page[i:j+len("</svg>")]), &root); err != nil {
		t.Fatalf("the timeline is not well-formed SVG: %v", err)
	}
	return root
}

// find lists the elements named tag whose class list holds class.
func (n svgNode) find(tag, class string) []svgNode {
	var out []svgNode
	if n.XMLName.Local == tag && (class == "" || strings.Contains(" "+n.Class+" ", " "+class+" ")) {
		out = append(out, n)
	}
	for _, c := range n.Children {
		out = append(out, c.find(tag, class)...)
	}
	return out
}

func (n svgNode) byID(id string) (svgNode, bool) {
	for _, l := range n.find("line", "") {
		if l.ID == id {
			return l, true
		}
	}
	return svgNode{}, false
}

func x1(t *testing.T, n svgNode) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(n.X1, 64)
	if err != nil {
		t.Fatalf("x1 %q: %v", n.X1, err)
	}
	return v
}

// A run driven through its deadline: before it fires, the timeline shows
// the steps with their spare time, B, fires_at and now; after, the step
// that fired (its decision left no spare), the checkpoint, the deadline
// snapshot with its duration, and the firing before B.
func TestTimelineOfARunThroughItsDeadline(t *testing.T) {
	w := newWorld(t)
	w.createRun()
	for n := int64(1); n <= 3; n++ {
		if a := w.step(n); a != v1.StepAction_STEP_ACTION_CONTINUE {
			t.Fatalf("step %d: %v, want CONTINUE", n, a)
		}
	}
	page := w.admin("/runs/r")
	svg := parseSVG(t, page)
	if got := len(svg.find("line", "step")); got != 3 {
		t.Errorf("before the deadline: %d step marks, want 3", got)
	}
	for _, id := range []string{"line-B", "line-fires-at", "line-now"} {
		if _, ok := svg.byID(id); !ok {
			t.Errorf("before the deadline: no %s", id)
		}
	}
	if _, ok := svg.byID("line-fired"); ok {
		t.Error("before the deadline: a line-fired")
	}
	index := w.admin("/")
	if !strings.Contains(index, `href="/runs/r"`) || !strings.Contains(index, "running") || !strings.Contains(index, "in 8m30s") {
		t.Errorf("the index does not show run r running, B in 8m30s:\n%s", index)
	}

	fired := int64(0)
	for n := int64(4); n <= 30 && fired == 0; n++ {
		if w.step(n) == v1.StepAction_STEP_ACTION_SAVE_AND_STOP {
			fired = n
		}
	}
	if fired == 0 {
		t.Fatal("the deadline never fired")
	}
	w.saveAtDeadline(fired)

	page = w.admin("/runs/r")
	svg = parseSVG(t, page)
	steps := svg.find("line", "step")
	if int64(len(steps)) != fired {
		t.Errorf("%d step marks, want %d", len(steps), fired)
	}
	if got := svg.find("line", "save-and-stop"); len(got) != 1 || !strings.Contains(got[0].Title, "step "+strconv.FormatInt(fired, 10)+":") {
		t.Errorf("save-and-stop marks %v, want one, for step %d", got, fired)
	}
	decisions := svg.find("circle", "decision")
	if int64(len(decisions)) != fired {
		t.Fatalf("%d decision points, want %d", len(decisions), fired)
	}
	for i, d := range decisions {
		noSpare := strings.Contains(d.Class, "no-spare")
		if want := int64(i+1) == fired; noSpare != want {
			t.Errorf("decision %d (%s): drawn as leaving no spare: %v, want %v", i+1, d.Title, noSpare, want)
		}
		if !strings.Contains(d.Title, "spare") {
			t.Errorf("decision %d: title %q does not give its spare time", i+1, d.Title)
		}
	}
	if got := svg.find("path", "checkpoint"); len(got) != 1 || !strings.Contains(got[0].Title, "checkpoint of step") {
		t.Errorf("checkpoint marks %v, want the fired step's", got)
	}
	snaps := svg.find("rect", "snapshot")
	if len(snaps) != 1 || !strings.Contains(snaps[0].Class, "saved") || !strings.Contains(snaps[0].Title, "deadline") || !strings.Contains(snaps[0].Title, "10s") {
		t.Errorf("snapshot bars %v, want the deadline snapshot, saved, 10s", snaps)
	}
	b, okB := svg.byID("line-B")
	f, okF := svg.byID("line-fired")
	if !okB || !okF {
		t.Fatalf("line-B %v, line-fired %v: want both", okB, okF)
	}
	if x1(t, f) >= x1(t, b) {
		t.Errorf("the firing is drawn at x %v, not before B at %v", x1(t, f), x1(t, b))
	}
	if _, ok := svg.byID("line-now"); ok {
		t.Error("a stopped run's timeline still has a now line")
	}
	for _, want := range []string{"stopped", `http-equiv="refresh"`, "Latest decisions", "save-and-stop", "before B)"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// An ended run has no countdown to B, in its page or in the list.
	if index := w.admin("/"); strings.Contains(page, "(in ") || !strings.Contains(index, "ended ") || !strings.Contains(index, " before B") {
		t.Errorf("a stopped run still counts down to B, or does not say how its end stood to B:\n%s", index)
	}
}

// A run that missed its deadline says so, with why, in the list and on its
// page.
func TestMissedDeadlineIsShown(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	spec := spectest.Checkpointed(1, "00:00:30:00")
	spec.StartedAt = timestamppb.New(start.Add(-time.Hour))
	_, err := w.eng.CreateRun(ctx, &v1.CreateRunRequest{RunId: "late", Spec: spec})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	rank, err := w.eng.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: "late", Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"})
	if err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	if _, err := w.eng.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: "late", WorkerId: rank.GetWorkerId(), Step: 1, IterationSeconds: 1}); err != nil {
		t.Fatalf("CompleteStep: %v", err)
	}
	got, err := w.eng.GetRun(ctx, &v1.GetRunRequest{RunId: "late"})
	if err != nil || !got.GetRun().GetDeadlineMissed() {
		t.Fatalf("GetRun: %v, %v; want the run marked as having missed its deadline", got, err)
	}
	for _, path := range []string{"/", "/runs/late"} {
		if page := w.admin(path); !strings.Contains(page, "DEADLINE MISSED") || !strings.Contains(page, template.HTMLEscapeString(got.GetRun().GetDeadlineMissedReason())) {
			t.Errorf("GET %s does not show the missed deadline and why (%q):\n%s", path, got.GetRun().GetDeadlineMissedReason(), page)
		}
	}
}
