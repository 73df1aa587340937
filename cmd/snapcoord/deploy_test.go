package main

import (
	"os"
	"regexp"
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
// fires and a panel that stays empty.
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
}

// exported reports whether name is a family of the scrape, or the
// _bucket, _count or _sum series of a histogram family.
func exported(fams map[string]*dto.MetricFamily, name string) bool {
	if _, ok := fams[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && fams[base].GetType() == dto.MetricType_HISTOGRAM {
			return true
		}
	}
	return false
}
