package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// deployFiles are the alert rules and the dashboard under deploy/.
var deployFiles = []string{
	"../../deploy/prometheus/snapcoord-alerts.yml",
	"../../deploy/grafana/snapcoord-dashboard.json",
}

var metricName = regexp.MustCompile(`\b(snapcoord_[a-z0-9_]+|rpc_server_[a-z0-9_]+|process_start_time_seconds)\b`)

// Every metric the alert rules and the dashboard query is one the real
// coordinator exports: a renamed metric would leave an alert that never
// fires and a panel that stays empty. And the reverse, on the same scrape:
// every snapcoord_ and rpc_server_ family has a dashboard panel, so a
// metric added later is not one the operator never sees.
func TestDeployReferencesRealMetrics(t *testing.T) {
	c := startCoordinator(t, map[string]string{adminTokenEnv: adminToken})
	scenario(t, c)                           // histograms, counters and the deadline sequence
	stepLiveRun(t, c, "live", runSpec(1), 1) // for the per-run series
	// A run whose B passed half an hour ago: its first decision misses it.
	late := runSpec(1)
	late.StartedAt = timestamppb.New(time.Now().Add(-time.Hour))
	late.Checkpointing.CheckpointMustSaveBy = "00:00:30:00"
	stepLiveRun(t, c, "late", late, 1)
	fams := scrapeMetrics(t, c.metricsAddr)
	// The certificate expiry series exist only with TLS on.
	pki := newTestPKI(t)
	withTLS := startCoordinator(t, nil, "--tls-cert", pki.serverCert, "--tls-key", pki.serverKey, "--client-ca", pki.caFile)
	for name, fam := range scrapeMetrics(t, withTLS.metricsAddr) {
		if fams[name] == nil {
			fams[name] = fam
		}
	}

	for _, path := range deployFiles {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, n := range metricName.FindAllString(string(data), -1) {
			names[n] = true
		}
		if len(names) < 5 {
			t.Fatalf("%s names only %v: the pattern no longer finds its metrics", path, names)
		}
		var missing []string
		for n := range names {
			if !exported(fams, n) {
				missing = append(missing, n)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("%s queries metrics the coordinator does not export: %v", path, missing)
		}
	}
	if missing := familiesOffDashboard(fams, flatten(readDashboard(t))); len(missing) > 0 {
		t.Errorf("the coordinator exports %v, but no dashboard panel queries them: add a panel, or list them in offDashboard with why", missing)
	}
}

// offDashboard lists the families the dashboard leaves out on purpose, each
// with why. The Go runtime and process families (go_, process_, promhttp_,
// target_info) are left out as a class: see dashboardPrefixes.
var offDashboard = map[string]string{}

// dashboardPrefixes are the families the dashboard must cover: the
// coordinator's own and its RPCs'.
var dashboardPrefixes = []string{"snapcoord_", "rpc_server_"}

// dashPanel is the part of a Grafana panel the checks read.
type dashPanel struct {
	ID      int
	Title   string
	GridPos struct{ X, Y, W, H int }
	Targets []struct{ Expr string }
	Panels  []dashPanel // a collapsed row's
}

// readDashboard returns the dashboard's top-level panels: rows, and the
// panels of rows not collapsed.
func readDashboard(t *testing.T) []dashPanel {
	t.Helper()
	data, err := os.ReadFile("../../deploy/grafana/snapcoord-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct{ Panels []dashPanel }
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("snapcoord-dashboard.json: %v", err)
	}
	return dash.Panels
}

// flatten lists the panels, those of a collapsed row after it.
func flatten(panels []dashPanel) []dashPanel {
	var all []dashPanel
	for _, p := range panels {
		all = append(all, p)
		all = append(all, flatten(p.Panels)...)
	}
	return all
}

// familiesOffDashboard lists the families of the scrape, under
// dashboardPrefixes, that no panel's query names (a histogram's through
// its _bucket, _count or _sum series) and offDashboard does not excuse.
func familiesOffDashboard(fams map[string]*dto.MetricFamily, panels []dashPanel) []string {
	queried := map[string]bool{}
	for _, p := range panels {
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				queried[familyOf(fams, n)] = true
			}
		}
	}
	var missing []string
	for name := range fams {
		covered := slices.ContainsFunc(dashboardPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
		if !covered || queried[name] || offDashboard[name] != "" {
			continue
		}
		missing = append(missing, name)
	}
	sort.Strings(missing)
	return missing
}

// The dashboard's panels have unique ids and none covers another: Grafana
// would shuffle overlapping panels on import, not where the JSON puts them.
// A collapsed row's panels are laid out only when it opens, so only the
// top-level ones are checked for overlaps.
func TestDeployDashboardLayout(t *testing.T) {
	top := readDashboard(t)
	ids := map[int]string{}
	for _, p := range flatten(top) {
		if other, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
	}
	for i, p := range top {
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		for _, q := range top[:i] {
			if overlap(p.GridPos, q.GridPos) {
				t.Errorf("panels %q %+v and %q %+v overlap", q.Title, q.GridPos, p.Title, p.GridPos)
			}
		}
	}
}

func overlap(a, b struct{ X, Y, W, H int }) bool {
	return a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
}

// exported reports whether name is a family of the scrape, or the
// _bucket, _count or _sum series of a histogram family.
func exported(fams map[string]*dto.MetricFamily, name string) bool {
	return familyOf(fams, name) != ""
}

// familyOf returns the family of the scrape that name is: name itself, or
// the histogram whose _bucket, _count or _sum series it is; "" if none.
func familyOf(fams map[string]*dto.MetricFamily, name string) string {
	if _, ok := fams[name]; ok {
		return name
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && fams[base].GetType() == dto.MetricType_HISTOGRAM {
			return base
		}
	}
	return ""
}
