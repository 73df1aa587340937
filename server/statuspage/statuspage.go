// Package statuspage serves a read-only status page on the metrics
// listener: the runs with their state and time to B, and for one run a
// timeline drawn as inline SVG (steps and each decision's spare time,
// checkpoints, snapshots with their durations, B, fires_at and the moment
// the deadline fired). It is rendered on the server with html/template,
// refreshes itself with a meta refresh and needs no JavaScript.
//
// It reads through the same engine methods RunService serves, and admits
// a viewer or admin token (HTTP basic auth's password, or a bearer token)
// when any is configured.
package statuspage

import (
	"context"
	"errors"
	"html/template"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/apifacts"
	"github.com/snapcoord/snapcoord/server/engine"
)

// Runs is the engine's read API the page uses; *engine.Engine is one.
type Runs interface {
	ListRuns(ctx context.Context, req *v1.ListRunsRequest) (*v1.ListRunsResponse, error)
	GetRun(ctx context.Context, req *v1.GetRunRequest) (*v1.GetRunResponse, error)
	WatchRun(ctx context.Context, req *v1.WatchRunRequest, send func(*v1.RunEvent) error) error
	ListSnapshots(ctx context.Context, req *v1.ListSnapshotsRequest) (*v1.ListSnapshotsResponse, error)
	ListWorkers(ctx context.Context, req *v1.ListWorkersRequest) (*v1.ListWorkersResponse, error)
}

// Admitter applies the page's rule to a token (a viewer or admin token,
// when any is configured); *auth.Authenticator is one. The error is a gRPC
// status (Unauthenticated, PermissionDenied).
type Admitter interface {
	CheckViewer(token string, present bool) error
}

// Options configure the page.
type Options struct {
	Runs   Runs
	Admit  Admitter
	Now    func() time.Time // default time.Now
	Logger *slog.Logger
	// Refresh is the meta refresh interval; default 5 s.
	Refresh time.Duration
	// LeaseTTL is the coordinator's --lease-ttl: a worker's last heartbeat
	// is its lease's end minus it. 0: the page shows the lease's end.
	LeaseTTL time.Duration
	// Leader says who leads the coordinator's group; nil: this one, always.
	Leader func() Leader
}

// Leader is who leads a group of coordinators on etcd, as the page's
// coordinator knows it.
type Leader struct {
	// Self: this coordinator leads (or is alone on its store).
	Self bool
	// Known: another coordinator leads; PageURL is the base URL of its
	// status page, "" if it published none.
	Known   bool
	PageURL string
}

// Page is the status page's http.Handler: "/" lists the runs, "/runs/{id}"
// shows one.
type Page struct {
	opts Options
	mux  *http.ServeMux
}

// New builds the page.
func New(opts Options) *Page {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Refresh <= 0 {
		opts.Refresh = 5 * time.Second
	}
	p := &Page{opts: opts, mux: http.NewServeMux()}
	p.mux.HandleFunc("GET /{$}", p.index)
	p.mux.HandleFunc("GET /runs/{id}", p.run)
	return p
}

// ServeHTTP admits the caller, then serves the page.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token, present := credential(r)
	if err := p.opts.Admit.CheckViewer(token, present); err != nil {
		refuse(w, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'")
	if p.opts.Leader != nil {
		if l := p.opts.Leader(); !l.Self {
			p.elsewhere(w, r, l)
			return
		}
	}
	p.mux.ServeHTTP(w, r)
}

// elsewhere answers on a follower: a redirect to the same page on the
// leader, or, while there is none to send to, a 503 that says why and
// reloads itself. The leader's gRPC address is never given: it is no page.
func (p *Page) elsewhere(w http.ResponseWriter, r *http.Request, l Leader) {
	if l.Known && l.PageURL != "" {
		http.Redirect(w, r, l.PageURL+r.URL.Path, http.StatusTemporaryRedirect)
		return
	}
	msg := "this coordinator follows, and no coordinator leads yet: electing a leader; this page reloads"
	if l.Known {
		msg = "this coordinator follows; the leader publishes no status page address (give it --advertise-http, or a --metrics-listen others can reach)"
	}
	w.Header().Set("Refresh", strconv.Itoa(int(p.opts.Refresh/time.Second)))
	http.Error(w, msg, http.StatusServiceUnavailable)
}

// credential reads a viewer or admin token from "Authorization: Bearer <token>"
// (curl, scripts) or from HTTP basic auth's password, any user name (a
// browser asks for it once and keeps it for the session). Never from the
// URL: URLs end up in logs and browser history.
func credential(r *http.Request) (token string, present bool) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", false
	}
	if _, pass, ok := r.BasicAuth(); ok {
		return pass, true
	}
	scheme, tok, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "bearer") {
		return "", true
	}
	return strings.TrimSpace(tok), true
}

// refuse answers a refused credential: 401 with a basic-auth challenge, so
// a browser asks for the token, or 403 for a run token.
func refuse(w http.ResponseWriter, err error) {
	if status.Code(err) == codes.PermissionDenied {
		http.Error(w, status.Convert(err).Message(), http.StatusForbidden)
		return
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="snapcoord status: any user name, a viewer token as password", charset="UTF-8"`)
	http.Error(w, status.Convert(err).Message(), http.StatusUnauthorized)
}

// runIDPattern is run_id's rule in the protos; the engine expects
// requests that passed it.
var runIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

// maxListed bounds the index: one ListRuns page.
const maxListed = 1000

func (p *Page) index(w http.ResponseWriter, r *http.Request) {
	resp, err := p.opts.Runs.ListRuns(r.Context(), &v1.ListRunsRequest{PageSize: maxListed})
	if err != nil {
		p.fail(w, err)
		return
	}
	now := p.opts.Now()
	data := indexData{header: p.header("snapcoord runs", now), More: resp.GetNextPageToken() != ""}
	for _, run := range resp.GetRuns() {
		data.Runs = append(data.Runs, summarize(run, now))
	}
	p.render(w, "index", data)
}

func (p *Page) run(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !runIDPattern.MatchString(id) {
		http.Error(w, "run_id: not a valid run id", http.StatusNotFound)
		return
	}
	tl, err := loadTimeline(r.Context(), p.opts.Runs, id)
	if err != nil {
		p.fail(w, err)
		return
	}
	now := p.opts.Now()
	data := runData{header: p.header("snapcoord run "+id, now), Run: summarize(tl.run, now), Timeline: tl.draw(now),
		Workers: tl.workerRows(now, p.opts.LeaseTTL), MoreWorkers: len(tl.workers) >= maxWorkers}
	for _, wr := range data.Workers {
		if len(wr.Flags) > 0 {
			data.Flagged = append(data.Flagged, wr.Name+": "+strings.Join(wr.Flags, "; "))
		}
	}
	p.render(w, "run", data)
}

func (p *Page) fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, engine.ErrNotFound):
		http.Error(w, "run not found", http.StatusNotFound)
	case errors.Is(err, engine.ErrUnavailable):
		msg := "the coordinator is unavailable"
		if ee, ok := errors.AsType[*engine.Error](err); ok {
			msg = ee.Msg // a follower's says where the leader is
		}
		http.Error(w, msg, http.StatusServiceUnavailable)
	default:
		p.opts.Logger.Error("status page", "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
	}
}

func (p *Page) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := pages.ExecuteTemplate(w, name, data); err != nil {
		p.opts.Logger.Debug("status page: write", "err", err)
	}
}

// header is what every page shows at the top.
type header struct {
	Title      string
	Now        string
	RefreshSec int
}

func (p *Page) header(title string, now time.Time) header {
	return header{Title: title, Now: now.UTC().Format(timeLayout), RefreshSec: int(p.opts.Refresh / time.Second)}
}

type indexData struct {
	header
	Runs []runSummary
	More bool
}

type runData struct {
	header
	Run         runSummary
	Timeline    timelineView
	Workers     []workerRow
	MoreWorkers bool
	Flagged     []string // each flagged worker, with why
}

// runSummary is one run's line in the index and head of its page.
type runSummary struct {
	ID, State, StateClass       string
	UntilB, UntilFires, B, Fire string
	LastStep                    int64
	FiredAt, Ended, Failure     string
	Missed                      string // why the run missed its deadline; empty if it did not
	PastB                       string // a live run past B: by how much, and that it has not saved
	I, C, R, M                  string
}

const timeLayout = "2006-01-02 15:04:05 UTC"

func summarize(run *v1.Run, now time.Time) runSummary {
	d := run.GetDeadline()
	s := runSummary{
		ID: run.GetRunId(), State: apifacts.EnumLower(run.GetState()), LastStep: run.GetLastStep(),
		Failure: run.GetFailureMessage(),
		I:       seconds(d.GetIterationSeconds()), C: seconds(d.GetCheckpointSeconds()),
		R: seconds(d.GetSaveReserveSeconds()), M: seconds(d.GetMarginSeconds()),
	}
	s.StateClass = "state-" + s.State
	if b := d.GetMustSaveBy(); b != nil {
		s.B, s.UntilB = b.AsTime().UTC().Format(timeLayout), until(b.AsTime().Sub(now))
		if e := run.GetEndedAt(); e != nil {
			// No countdown once the run is over: how its end stood to B.
			s.UntilB = endedRelativeTo(e.AsTime(), b.AsTime())
		}
	}
	if f := d.GetFiresAt(); f != nil && run.GetFiredAt() == nil {
		s.Fire, s.UntilFires = f.AsTime().UTC().Format(timeLayout), until(f.AsTime().Sub(now))
	}
	if f := run.GetFiredAt(); f != nil {
		s.FiredAt = f.AsTime().UTC().Format(timeLayout)
	}
	if run.GetDeadlineMissed() {
		s.Missed = run.GetDeadlineMissedReason()
		if s.Missed == "" {
			s.Missed = "deadline missed"
		}
	}
	if e := run.GetEndedAt(); e != nil {
		s.Ended = e.AsTime().UTC().Format(timeLayout)
	}
	s.PastB = pastB(run, now)
	return s
}

// pastB flags a run that is not over at B: its save has not begun (or
// not finished), so the job is about to lose its work or already did.
func pastB(run *v1.Run, now time.Time) string {
	b := run.GetDeadline().GetMustSaveBy()
	if b == nil || run.GetEndedAt() != nil || !now.After(b.AsTime()) {
		return ""
	}
	late := human(now.Sub(b.AsTime()))
	switch run.GetState() {
	case v1.RunState_RUN_STATE_SAVING, v1.RunState_RUN_STATE_SNAPSHOTTING:
		return "PAST B by " + late + ": the deadline save has not finished"
	default:
		return "PAST B by " + late + ": not saved"
	}
}

var pages = template.Must(template.New("").Parse(pageTemplates))
