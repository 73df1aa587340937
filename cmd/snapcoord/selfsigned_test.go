package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// trustOnly is a client that trusts nothing but the CA in caFile, as one
// given SNAPCOORD_CA_FILE does.
func trustOnly(t *testing.T, caFile string) credentials.TransportCredentials {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", caFile)
	}
	return credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
}

func wantMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s has mode %v, want %v", filepath.Base(path), got, want)
	}
}

// A job's coordinator with --tls-self-signed serves TLS that a client
// trusting only the written CA accepts, a client without it refuses, and a
// restart on the same directory keeps: the client made before the restart
// (holding the first ca.pem) talks to the new coordinator.
func TestTLSSelfSignedServesWhatItsCAFileVerifies(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	env := map[string]string{adminTokenEnv: adminToken}
	first := startCoordinator(t, env, "--tls-self-signed", dir)
	caFile := filepath.Join(dir, selfSignedCA)
	creds := trustOnly(t, caFile) // loaded once, as a client on another node would
	caBefore, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	wantMode(t, filepath.Join(dir, selfSignedCAKey), 0o600)
	wantMode(t, filepath.Join(dir, selfSignedKey), 0o600)
	wantMode(t, caFile, 0o644)

	conn := dialWith(t, first.addr, creds)
	if _, err := v1.NewRunServiceClient(conn).CreateRun(bearer(t.Context(), adminToken),
		&v1.CreateRunRequest{RunId: "job-1", Spec: runSpec(1)}); err != nil {
		t.Fatalf("CreateRun over the self-signed TLS, trusting only %s: %v", selfSignedCA, err)
	}
	cert := leafOf(t, filepath.Join(dir, selfSignedCert))
	host, _ := os.Hostname()
	if !slices.Contains(cert.DNSNames, host) || cert.VerifyHostname("127.0.0.1") != nil {
		t.Errorf("the certificate holds %v and %v, want the host name %q and the --listen address 127.0.0.1", cert.DNSNames, cert.IPAddresses, host)
	}

	// Without the CA: the system roots do not know it.
	_, err = healthpb.NewHealthClient(dialWith(t, first.addr, credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12}))).
		Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("a client without the CA: %v, want an unknown authority", err)
	}

	first.stop()
	second := startCoordinator(t, env, "--tls-self-signed", dir)
	caAfter, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(caBefore, caAfter) {
		t.Error("the restart replaced ca.pem: clients holding the first one would no longer connect")
	}
	if leafOf(t, filepath.Join(dir, selfSignedCert)).SerialNumber.Cmp(cert.SerialNumber) == 0 {
		t.Error("the restart kept the server certificate: a requeued job on another host needs one for its names")
	}
	h, err := healthpb.NewHealthClient(dialWith(t, second.addr, creds)).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("the restarted coordinator, with the CA loaded before the restart: %v, %v", h, err)
	}
	if !strings.Contains(second.logs.String(), `"ca_reused":true`) {
		t.Errorf("the restart does not log that it reused the CA:\n%s", second.logs)
	}
}

func leafOf(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := parsePEM(data, "CERTIFICATE", x509.ParseCertificate)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cert
}

// A CA certificate whose key is gone is not silently replaced: clients
// trust it, and a new CA would lock them all out.
func TestTLSSelfSignedRefusesACAWithoutItsKey(t *testing.T) {
	dir := t.TempDir()
	if _, err := provisionSelfSigned(dir, "127.0.0.1:0", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, selfSignedCAKey)); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := runServe(t.Context(), []string{"--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--tls-self-signed", dir}, noEnv, &stdout, &stderr)
	if code != exitFail || !strings.Contains(stderr.String(), "is there but not its key") {
		t.Errorf("exit %d, stderr %q; want %d saying the CA's key is missing", code, stderr.String(), exitFail)
	}
}

func TestTLSSelfSignedExcludesTLSCert(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := runServe(t.Context(), []string{"--tls-self-signed", t.TempDir(), "--tls-cert", "c.pem", "--tls-key", "k.pem"}, noEnv, &stdout, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "--tls-self-signed (SNAPCOORD_TLS_SELF_SIGNED) makes its own certificate") {
		t.Errorf("exit %d, stderr %q; want %d naming --tls-self-signed", code, stderr.String(), exitUsage)
	}
}

// A wildcard --listen: the certificate holds every address a client on
// another node may dial, since the coordinator cannot know which one.
func TestTLSSelfSignedWildcardCoversTheInterfaces(t *testing.T) {
	hosts, err := certHosts("0.0.0.0:7070")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() && !slices.Contains(hosts, n.IP.String()) {
			t.Errorf("hosts %v lack this host's address %s", hosts, n.IP)
		}
	}
	if _, err := certHosts("no-port"); err == nil || !strings.Contains(err.Error(), "--listen") {
		t.Errorf("a --listen without a port: %v, want an error naming --listen", err)
	}
}

// A CA close to its end is replaced rather than outlived by the server
// certificate it would sign; one with time left is kept.
func TestTLSSelfSignedRenewsACAAboutToExpire(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	first, err := provisionSelfSigned(dir, "127.0.0.1:0", now)
	if err != nil {
		t.Fatal(err)
	}
	ca := leafOf(t, first.CAFile)
	kept, err := provisionSelfSigned(dir, "127.0.0.1:0", now.Add(selfSignedCAValid-selfSignedCertValid-time.Hour))
	if err != nil || !kept.CAReused || leafOf(t, kept.CAFile).SerialNumber.Cmp(ca.SerialNumber) != 0 {
		t.Fatalf("with 90 days and an hour left: %+v, %v; want the CA kept", kept, err)
	}
	renewed, err := provisionSelfSigned(dir, "127.0.0.1:0", now.Add(selfSignedCAValid-selfSignedCertValid+time.Hour))
	if err != nil || renewed.CAReused || leafOf(t, renewed.CAFile).SerialNumber.Cmp(ca.SerialNumber) == 0 {
		t.Fatalf("with less than 90 days left: %+v, %v; want a new CA", renewed, err)
	}
	wantMode(t, filepath.Join(dir, selfSignedCAKey), 0o600)
}
