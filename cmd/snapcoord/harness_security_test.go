package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/logsink"
	"github.com/snapcoord/snapcoord/internal/testkit/spectest"
	"github.com/snapcoord/snapcoord/internal/testkit/testpki"
)

// served is `snapcoord serve` run in-process on loopback ports, with
// JSON logs at debug level captured for inspection.
type served struct {
	addr        string
	metricsAddr string
	logs        *logsink.Watcher
	stop        func() // cancels serve and checks it exited 0; safe to call again
}

// startCoordinator runs serve with the test defaults plus args, and env as
// its whole environment.
func startCoordinator(t *testing.T, env map[string]string, args ...string) *served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := logsink.NewWatcher()
	base := []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--log-format", "json", "--log-level", "debug"}
	done := make(chan int, 1)
	go func() { done <- runServe(ctx, append(base, args...), envMap(env), logs, logs) }()
	c := &served{logs: logs}
	select {
	case c.addr = <-logs.Serving():
	case code := <-done:
		cancel()
		t.Fatalf("serve exited %d before serving:\n%s", code, logs)
	}
	// "metrics listening" is logged before "serving".
	for _, l := range lines(logs.String()) {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == "metrics listening" {
			c.metricsAddr = rec.Addr
		}
	}
	var exited bool
	c.stop = func() {
		if exited {
			return
		}
		exited = true
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("serve exited %d after cancel, want 0:\n%s", code, logs)
		}
	}
	t.Cleanup(c.stop)
	return c
}

// dialWith connects to addr with creds (plaintext when nil).
func dialWith(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// bearer attaches a token the way every client does.
func bearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func runSpec(worldSize int32) *v1.RunSpec { return spectest.Checkpointed(worldSize, "00:03:45:00") }

// scrapeMetrics reads the coordinator's /metrics.
func scrapeMetrics(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// seriesValue sums the series of a family whose labels include want:
// counter and gauge values, histogram sample counts.
func seriesValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	var sum float64
next:
	for _, m := range fams[name].GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, plus a client certificate from an unrelated CA; all PEM
// files in one directory.
type testPKI struct {
	caFile, serverCert, serverKey, clientCert, clientKey, rogueCert, rogueKey string
	caPool                                                                    *x509.CertPool
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	rogue := testpki.NewCA(t, dir, "rogue-ca")
	server := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	client := ca.Issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	rogueClient := rogue.Issue(t, dir, "rogue", x509.ExtKeyUsageClientAuth)
	return testPKI{caFile: ca.File, caPool: ca.Pool,
		serverCert: server.CertFile, serverKey: server.KeyFile,
		clientCert: client.CertFile, clientKey: client.KeyFile,
		rogueCert: rogueClient.CertFile, rogueKey: rogueClient.KeyFile}
}

func (p testPKI) clientTLS(t *testing.T, certFile, keyFile string) credentials.TransportCredentials {
	t.Helper()
	cfg := &tls.Config{RootCAs: p.caPool, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg)
}
