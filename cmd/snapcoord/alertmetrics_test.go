package main

import (
	"crypto/x509"
	"os"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/snapcoord/snapcoord/internal/testkit/testpki"
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
	for _, what := range []string{"admin_tokens", "tls"} {
		wantSeries(t, fams, "snapcoord_credentials_reload_failures_total", map[string]string{"credentials": what}, 0)
		wantSeries(t, fams, "snapcoord_credentials_reload_failed", map[string]string{"credentials": what}, 0)
	}
}

// A reload that fails shows on /metrics until a reload succeeds, for the
// TLS files and the admin token file alike; the certificates' expiry is
// their real NotAfter, the new one's after a rotation.
func TestCredentialReloadFailuresAndCertificateExpiryOnMetrics(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := testpki.NewCA(t, dir, "server-ca"), testpki.NewCA(t, dir, "client-ca")
	inTenDays := time.Now().Add(10 * 24 * time.Hour)
	server1 := serverCA.IssueUntil(t, dir, "server-1", x509.ExtKeyUsageServerAuth, inTenDays)
	c, files := startRotatable(t, dir, server1, clientCA)
	const failed, failures, expiry = "snapcoord_credentials_reload_failed", "snapcoord_credentials_reload_failures_total",
		"snapcoord_tls_certificate_expiry_timestamp_seconds"
	tlsL, tokensL := map[string]string{"credentials": "tls"}, map[string]string{"credentials": "admin_tokens"}
	serverL, clientCAL := map[string]string{"certificate": "server"}, map[string]string{"certificate": "client_ca"}

	fams := scrapeMetrics(t, c.metricsAddr)
	wantSeries(t, fams, expiry, serverL, float64(server1.TLS.Leaf.NotAfter.Unix()))
	wantSeries(t, fams, expiry, clientCAL, float64(clientCA.Cert.NotAfter.Unix()))

	// A key that does not match the certificate: the reload fails.
	server2 := serverCA.IssueUntil(t, dir, "server-2", x509.ExtKeyUsageServerAuth, inTenDays.Add(20*24*time.Hour))
	refused := c.logs.Next("TLS files not reloaded; the previous certificate, key and client CA stay in use", "")
	install(t, server2.KeyFile, files.key)
	reloaded(t, "the mismatched pair refused", refused)
	fams = scrapeMetrics(t, c.metricsAddr)
	wantSeries(t, fams, failed, tlsL, 1)
	wantSeries(t, fams, failures, tlsL, 1)
	wantSeries(t, fams, failed, tokensL, 0)
	wantSeries(t, fams, expiry, serverL, float64(server1.TLS.Leaf.NotAfter.Unix())) // still the one in use

	// The matching certificate: the reload succeeds, the failure is over
	// (its count stays) and the new certificate's expiry shows.
	next := c.logs.Next("credentials reloaded", "tls")
	install(t, server2.CertFile, files.cert)
	reloaded(t, "the new certificate and key", next)
	fams = scrapeMetrics(t, c.metricsAddr)
	wantSeries(t, fams, failed, tlsL, 0)
	wantSeries(t, fams, failures, tlsL, 1)
	wantSeries(t, fams, expiry, serverL, float64(server2.TLS.Leaf.NotAfter.Unix()))

	// An admin token file with no token in it.
	refused = c.logs.Next("admin tokens not reloaded; the previous ones stay valid", "")
	if err := os.WriteFile(files.tokens+".src", []byte("# emptied by mistake\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	install(t, files.tokens+".src", files.tokens)
	reloaded(t, "the empty token file refused", refused)
	fams = scrapeMetrics(t, c.metricsAddr)
	wantSeries(t, fams, failed, tokensL, 1)
	wantSeries(t, fams, failures, tokensL, 1)
	wantSeries(t, fams, failed, tlsL, 0)
}
