package client_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/client"
	"github.com/snapcoord/snapcoord/internal/testkit/testpki"
)

var fastRetry = client.WithRetry(client.RetryPolicy{MaxAttempts: 3, Base: time.Millisecond, Max: 5 * time.Millisecond})

func TestRetriesOnlyIdempotentCalls(t *testing.T) {
	co := startCoordinator(t)
	co.createRun("r1", turnSpec(1))
	admin := co.dial("", fastRetry)
	ctx := t.Context()

	co.gate.set(func(g *gate) { g.failNext["GetRun"] = 2 })
	if _, err := admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: "r1"}); err != nil {
		t.Errorf("GetRun after 2 injected failures: %v, want success on the third attempt", err)
	}
	if n := co.gate.count("GetRun"); n != 3 {
		t.Errorf("GetRun attempts = %d, want 3", n)
	}

	co.gate.set(func(g *gate) { g.failNext["ListRuns"] = 3 })
	if _, err := admin.Runs.ListRuns(ctx, &v1.ListRunsRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("ListRuns failing 3 times: %v, want UNAVAILABLE after MaxAttempts", err)
	}

	// Not safe to repeat: one attempt, and the caller sees the error.
	co.gate.set(func(g *gate) { g.failNext["ReissueRunToken"] = 1 })
	if _, err := admin.Runs.ReissueRunToken(ctx, &v1.ReissueRunTokenRequest{RunId: "r1"}); status.Code(err) != codes.Unavailable {
		t.Errorf("ReissueRunToken = %v, want the UNAVAILABLE unretried", err)
	}
	if tr := co.gate.count("ReissueRunToken"); tr != 1 {
		t.Errorf("ReissueRunToken calls = %d, want 1", tr)
	}

	// CreateRun whose answer was lost: the retry gets a new token for the
	// run the first attempt created, and the token works.
	co.gate.set(func(g *gate) { g.loseReply["CreateRun"] = 1 })
	created, err := admin.Runs.CreateRun(ctx, &v1.CreateRunRequest{RunId: "r2", Spec: turnSpec(1)})
	if err != nil || created.GetRunToken() == "" {
		t.Fatalf("CreateRun after a lost answer: %v, token %q; want a token", err, created.GetRunToken())
	}
	if c := co.gate.count("CreateRun"); c != 3 { // createRun above made the first call
		t.Errorf("CreateRun calls = %d, want 3", c)
	}
	worker := co.dial(created.GetRunToken())
	if _, err := worker.Workers.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: "r2", Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"}); err != nil {
		t.Errorf("RegisterWorker with the retry's token: %v", err)
	}

	// Other codes are answers, not outages.
	if _, err := admin.Runs.GetRun(ctx, &v1.GetRunRequest{RunId: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetRun(nope) = %v, want NOT_FOUND", err)
	}
	if n := co.gate.count("GetRun"); n != 4 {
		t.Errorf("GetRun attempts = %d, want 4 (NOT_FOUND is not retried)", n)
	}
}

func TestBearerTokensPerService(t *testing.T) {
	co := startCoordinator(t)
	admin := co.dial("")
	resp, err := admin.Runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "r1", Spec: turnSpec(1)})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	w := startEnvWorker(t, co.dial(resp.GetRunToken()), "r1", false)
	select {
	case <-co.gate.streamed:
	case <-time.After(15 * time.Second):
		t.Fatal("the worker opened no command stream")
	}
	closeWorker(t, w)

	for method, want := range map[string]string{
		"CreateRun":        "Bearer " + adminToken,
		"RegisterWorker":   "Bearer " + resp.GetRunToken(),
		"StreamCommands":   "Bearer " + resp.GetRunToken(),
		"DeregisterWorker": "Bearer " + resp.GetRunToken(),
	} {
		if got := co.gate.lastAuth(method); got != want {
			t.Errorf("%s authorization = %q, want %q", method, got, want)
		}
	}
}

func TestDialRejectsBadOptions(t *testing.T) {
	for name, opts := range map[string][]client.Option{
		"token with a newline":   {client.WithInsecure(), client.WithToken("abc\n")},
		"TLS and insecure":       {client.WithInsecure(), client.WithTLS(client.TLS{ServerName: "x"})},
		"certificate and no key": {client.WithTLS(client.TLS{CertFile: "c.pem"})},
		"missing CA file":        {client.WithTLS(client.TLS{CAFile: filepath.Join(t.TempDir(), "none.pem")})},
	} {
		if c, err := client.Dial("127.0.0.1:1", opts...); err == nil {
			_ = c.Close()
			t.Errorf("%s: Dial succeeded, want an error", name)
		}
	}
}

// A coordinator with mutual TLS and a certificate for "snapcoord.test" only.
func TestDialMutualTLS(t *testing.T) {
	pki := newPKI(t)
	serverTLS := &tls.Config{
		Certificates: []tls.Certificate{pki.server}, ClientCAs: pki.pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	}
	co := startCoordinatorWith(t, []grpc.ServerOption{grpc.Creds(credentials.NewTLS(serverTLS))})
	noRetry := client.WithRetry(client.RetryPolicy{MaxAttempts: 1})
	good := client.TLS{CAFile: pki.caFile, CertFile: pki.certFile, KeyFile: pki.keyFile, ServerName: "snapcoord.test"}

	for _, tc := range []struct {
		name string
		tls  client.TLS
		ok   bool
	}{
		{"CA, client certificate, server name", good, true},
		{"no client certificate", client.TLS{CAFile: pki.caFile, ServerName: "snapcoord.test"}, false},
		{"system roots", client.TLS{CertFile: pki.certFile, KeyFile: pki.keyFile, ServerName: "snapcoord.test"}, false},
		{"address does not match the certificate", client.TLS{CAFile: pki.caFile, CertFile: pki.certFile, KeyFile: pki.keyFile}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := client.Dial(co.addr, client.WithTLS(tc.tls), client.WithToken(adminToken), noRetry)
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			_, err = cl.Runs.ListRuns(ctx, &v1.ListRunsRequest{})
			if tc.ok && err != nil {
				t.Errorf("ListRuns: %v", err)
			}
			if !tc.ok && err == nil {
				t.Error("ListRuns succeeded, want a handshake failure")
			}
		})
	}
}

// pki is a throwaway CA with a server and a client certificate.
type pki struct {
	pool                      *x509.CertPool
	server                    tls.Certificate
	caFile, certFile, keyFile string
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	server := ca.Issue(t, dir, "server", x509.ExtKeyUsageServerAuth, "snapcoord.test")
	client := ca.Issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	return pki{pool: ca.Pool, server: server.TLS, caFile: ca.File, certFile: client.CertFile, keyFile: client.KeyFile}
}
