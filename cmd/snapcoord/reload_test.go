package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/internal/testkit/testpki"
)

// install puts src's content at dst the way rotation tools do: written
// beside it, then renamed over it.
func install(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

func writeTokens(t *testing.T, path string, tokens ...string) {
	t.Helper()
	src := path + ".src"
	var data []byte
	for _, tok := range tokens {
		data = append(data, tok+"\n"...)
	}
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	install(t, src, path)
}

func tlsCreds(t *testing.T, roots *x509.CertPool, client testpki.Leaf) credentials.TransportCredentials {
	t.Helper()
	return credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{client.TLS}, MinVersion: tls.VersionTLS12})
}

// credentialFiles are the paths a coordinator reloads its credentials from.
type credentialFiles struct{ cert, key, clientCA, tokens string }

// startRotatable installs server's certificate and key, clientCA and the
// admin token at fixed paths in dir, and starts a coordinator that checks
// them every 10 ms.
func startRotatable(t *testing.T, dir string, server testpki.Leaf, clientCA *testpki.CA) (*served, credentialFiles) {
	t.Helper()
	f := credentialFiles{cert: filepath.Join(dir, "tls.pem"), key: filepath.Join(dir, "tls-key.pem"),
		clientCA: filepath.Join(dir, "client-ca.pem"), tokens: filepath.Join(dir, "admin-tokens")}
	install(t, server.CertFile, f.cert)
	install(t, server.KeyFile, f.key)
	install(t, clientCA.File, f.clientCA)
	writeTokens(t, f.tokens, adminToken)
	c := startCoordinator(t, nil, "--tls-cert", f.cert, "--tls-key", f.key, "--client-ca", f.clientCA,
		"--admin-token-file", f.tokens, "--credentials-check-interval", "10ms")
	return c, f
}

// reloaded waits for the coordinator to log msg (with attribute "what",
// when not empty) after next was asked for: the reload happens at its next
// check of the files, which only its log reports.
func reloaded(t *testing.T, what string, next <-chan struct{}) {
	t.Helper()
	select {
	case <-next:
	case <-time.After(15 * time.Second): // a hang guard, not a wait
		t.Fatalf("%s: the coordinator never logged it", what)
	}
}

// Rotating the server certificate and key, the client CA and the admin
// token, each while a worker streams commands over a connection made
// before: new connections and calls use the new material, the old material
// stops working for them, and the streaming worker is never dropped (it
// gets the Stop of a cancel sent with the last token).
func TestRotateCredentialsWhileAWorkerStreams(t *testing.T) {
	dir := t.TempDir()
	serverCA1, clientCA1 := testpki.NewCA(t, dir, "server-ca-1"), testpki.NewCA(t, dir, "client-ca-1")
	server1 := serverCA1.Issue(t, dir, "server-1", x509.ExtKeyUsageServerAuth)
	client1 := clientCA1.Issue(t, dir, "client-1", x509.ExtKeyUsageClientAuth)
	c, files := startRotatable(t, dir, server1, clientCA1)
	certFile, keyFile, caFile, tokenFile := files.cert, files.key, files.clientCA, files.tokens
	health := func(creds credentials.TransportCredentials) error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(dialWith(t, c.addr, creds)).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}

	// The worker connects with the first material and streams.
	conn := dialWith(t, c.addr, tlsCreds(t, serverCA1.Pool, client1))
	runs, workers := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
	created, err := runs.CreateRun(bearer(t.Context(), adminToken), &v1.CreateRunRequest{RunId: "r", Spec: runSpec(1)})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	asRun := bearer(t.Context(), created.GetRunToken())
	w, err := workers.RegisterWorker(asRun, &v1.RegisterWorkerRequest{RunId: "r", Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"})
	if err != nil {
		t.Fatalf("RegisterWorker: %v", err)
	}
	stream, err := workers.StreamCommands(asRun, &v1.StreamCommandsRequest{RunId: "r", WorkerId: w.GetWorkerId()})
	if err != nil {
		t.Fatalf("StreamCommands: %v", err)
	}
	stillServed := func(when string) {
		t.Helper()
		if _, err := workers.Heartbeat(asRun, &v1.HeartbeatRequest{RunId: "r", WorkerId: w.GetWorkerId()}); err != nil {
			t.Fatalf("%s: the worker's connection: Heartbeat: %v", when, err)
		}
	}

	// 1. Server certificate and key, from a new CA; the key lands first,
	// so for a moment the pair does not match and the old one must stay.
	serverCA2 := testpki.NewCA(t, dir, "server-ca-2")
	server2 := serverCA2.Issue(t, dir, "server-2", x509.ExtKeyUsageServerAuth)
	refused := c.logs.Next("TLS files not reloaded; the previous certificate, key and client CA stay in use", "")
	install(t, server2.KeyFile, keyFile)
	reloaded(t, "the mismatched pair refused", refused)
	if err := health(tlsCreds(t, serverCA1.Pool, client1)); err != nil {
		t.Fatalf("with a key that does not match the certificate, the old pair must stay: %v", err)
	}
	next := c.logs.Next("credentials reloaded", "tls")
	install(t, server2.CertFile, certFile)
	reloaded(t, "the new certificate and key", next)
	if err := health(tlsCreds(t, serverCA2.Pool, client1)); err != nil {
		t.Fatalf("a new connection trusting only the new server CA: %v", err)
	}
	if err := health(tlsCreds(t, serverCA1.Pool, client1)); status.Code(err) != codes.Unavailable {
		t.Errorf("a new connection trusting only the old server CA: %v, want a failed handshake", err)
	}
	stillServed("after the certificate rotation")

	// 2. Client CA: certificates of the new CA get in, the old CA's not.
	clientCA2 := testpki.NewCA(t, dir, "client-ca-2")
	client2 := clientCA2.Issue(t, dir, "client-2", x509.ExtKeyUsageClientAuth)
	next = c.logs.Next("credentials reloaded", "tls")
	install(t, clientCA2.File, caFile)
	reloaded(t, "the new client CA", next)
	if err := health(tlsCreds(t, serverCA2.Pool, client2)); err != nil {
		t.Fatalf("a new connection with a client certificate of the new client CA: %v", err)
	}
	if err := health(tlsCreds(t, serverCA2.Pool, client1)); status.Code(err) != codes.Unavailable {
		t.Errorf("a new connection with the old client CA's certificate: %v, want a refused handshake", err)
	}
	stillServed("after the client CA rotation")

	// 3. Admin token, over a new connection with the new material.
	newConn := v1.NewRunServiceClient(dialWith(t, c.addr, tlsCreds(t, serverCA2.Pool, client2)))
	next = c.logs.Next("credentials reloaded", "admin_tokens")
	writeTokens(t, tokenFile, adminToken2)
	reloaded(t, "the new admin token", next)
	if _, err := newConn.GetRun(bearer(t.Context(), adminToken2), &v1.GetRunRequest{RunId: "r"}); err != nil {
		t.Fatalf("GetRun with the new admin token: %v", err)
	}
	_, err = newConn.GetRun(bearer(t.Context(), adminToken), &v1.GetRunRequest{RunId: "r"})
	wantCode(t, "GetRun with the removed admin token", err, codes.Unauthenticated)
	stillServed("after the token rotation")

	// The stream opened before any rotation is still there to hear Stop.
	if _, err := newConn.CancelRun(bearer(t.Context(), adminToken2), &v1.CancelRunRequest{RunId: "r", Reason: "rotated"}); err != nil {
		t.Fatalf("CancelRun: %v", err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("the stream opened before the rotations: %v, want it to deliver Stop", err)
		}
		if resp.GetCommand().GetStop() != nil {
			break
		}
	}
	if got := c.logs.String(); !strings.Contains(got, `"what":"tls"`) || !strings.Contains(got, `"what":"admin_tokens"`) {
		t.Errorf("the log does not tell of each reload:\n%s", got)
	}
}
