package main

import (
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/snapcoord/snapcoord/server/engine"
)

// exactSeries finds the one series of family name whose labels are exactly
// want; nil when the scrape has none.
func exactSeries(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	for _, m := range fams[name].GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		if len(got) == len(want) && func() bool {
			for k, v := range want {
				if got[k] != v {
					return false
				}
			}
			return true
		}() {
			return m
		}
	}
	return nil
}

// wantSeries fails unless the scrape has the series, with value want.
func wantSeries(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string, want float64) {
	t.Helper()
	m := exactSeries(fams, name, labels)
	if m == nil {
		t.Errorf("%s%v: no such series on /metrics", name, labels)
		return
	}
	got := m.GetGauge().GetValue()
	if m.GetCounter() != nil {
		got = m.GetCounter().GetValue()
	}
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// A fresh coordinator exposes every counter an alert reads at 0, for each
// label value: a series that first appears at 1 shows Prometheus no
// increase, so the first missed deadline after a start would not alert.
func TestFreshCoordinatorExposesAlertCountersAtZero(t *testing.T) {
	c := startCoordinator(t, map[string]string{adminTokenEnv: adminToken})
	fams := scrapeMetrics(t, c.metricsAddr)
	if fams["snapcoord_deadline_missed_total"].GetType() != dto.MetricType_COUNTER {
		t.Fatalf("snapcoord_deadline_missed_total is not a counter on /metrics: %v", fams["snapcoord_deadline_missed_total"])
	}
	for _, cause := range engine.MissCauses() {
		wantSeries(t, fams, "snapcoord_deadline_missed_total", map[string]string{"cause": string(cause)}, 0)
	}
}
