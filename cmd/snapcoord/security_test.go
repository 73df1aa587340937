package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
	"github.com/snapcoord/snapcoord/server/coordinator"
)

const (
	adminToken  = "admin-0123456789abcdef0123456789"
	adminToken2 = "admin-rotated-fedcba9876543210fe"
)

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

// Every status code of the auth rules, from a real client against the real
// server, with the admin token from the environment.
func TestAuthStatusCodes(t *testing.T) {
	c := startCoordinator(t, map[string]string{adminTokenEnv: adminToken})
	conn := dialWith(t, c.addr, nil)
	runs, workers := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
	admin := bearer(t.Context(), adminToken)

	_, err := runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "run-a", Spec: runSpec(1)})
	wantCode(t, "CreateRun without a token", err, codes.Unauthenticated)
	_, err = runs.CreateRun(bearer(t.Context(), "not-the-admin-token-at-all"), &v1.CreateRunRequest{RunId: "run-a", Spec: runSpec(1)})
	wantCode(t, "CreateRun with a garbage token", err, codes.Unauthenticated)

	a, err := runs.CreateRun(admin, &v1.CreateRunRequest{RunId: "run-a", Spec: runSpec(1)})
	if err != nil {
		t.Fatalf("CreateRun(run-a) as admin: %v", err)
	}
	b, err := runs.CreateRun(admin, &v1.CreateRunRequest{RunId: "run-b", Spec: runSpec(1)})
	if err != nil {
		t.Fatalf("CreateRun(run-b) as admin: %v", err)
	}
	if a.GetRunToken() == "" || a.GetRunToken() == b.GetRunToken() {
		t.Fatalf("run tokens %q and %q: want two distinct tokens", a.GetRunToken(), b.GetRunToken())
	}
	asA, asB := bearer(t.Context(), a.GetRunToken()), bearer(t.Context(), b.GetRunToken())

	// A run token is no admin credential.
	_, err = runs.GetRun(asA, &v1.GetRunRequest{RunId: "run-a"})
	wantCode(t, "GetRun with a run token", err, codes.PermissionDenied)
	watch, err := runs.WatchRun(asA, &v1.WatchRunRequest{RunId: "run-a"})
	if err == nil {
		_, err = watch.Recv()
	}
	wantCode(t, "WatchRun with a run token", err, codes.PermissionDenied)

	reg := &v1.RegisterWorkerRequest{RunId: "run-a", Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"}
	_, err = workers.RegisterWorker(t.Context(), reg)
	wantCode(t, "RegisterWorker without a token", err, codes.Unauthenticated)
	_, err = workers.RegisterWorker(bearer(t.Context(), "scr_forged"), reg)
	wantCode(t, "RegisterWorker with an unknown token", err, codes.Unauthenticated)
	_, err = workers.RegisterWorker(admin, reg)
	wantCode(t, "RegisterWorker with the admin token", err, codes.PermissionDenied)
	_, err = workers.RegisterWorker(asB, reg)
	wantCode(t, "RegisterWorker on run-a with run-b's token", err, codes.PermissionDenied)
	w, err := workers.RegisterWorker(asA, reg)
	if err != nil {
		t.Fatalf("RegisterWorker with run-a's token: %v", err)
	}

	// run-b's token cannot touch run-a's worker, unary or streaming.
	_, err = workers.Heartbeat(asB, &v1.HeartbeatRequest{RunId: "run-a", WorkerId: w.GetWorkerId()})
	wantCode(t, "Heartbeat on run-a with run-b's token", err, codes.PermissionDenied)
	_, err = workers.CompleteStep(asB, &v1.CompleteStepRequest{RunId: "run-a", WorkerId: w.GetWorkerId(), Step: 1, IterationSeconds: 1})
	wantCode(t, "CompleteStep on run-a with run-b's token", err, codes.PermissionDenied)
	_, err = workers.PollCommands(asB, &v1.PollCommandsRequest{RunId: "run-a", WorkerId: w.GetWorkerId()})
	wantCode(t, "PollCommands on run-a with run-b's token", err, codes.PermissionDenied)
	stream, err := workers.StreamCommands(asB, &v1.StreamCommandsRequest{RunId: "run-a", WorkerId: w.GetWorkerId()})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, "StreamCommands on run-a with run-b's token", err, codes.PermissionDenied)

	// Its own token works, and nothing run-b's token tried changed run-a.
	if _, err := workers.Heartbeat(asA, &v1.HeartbeatRequest{RunId: "run-a", WorkerId: w.GetWorkerId()}); err != nil {
		t.Errorf("Heartbeat with run-a's token: %v", err)
	}
	got, err := runs.GetRun(admin, &v1.GetRunRequest{RunId: "run-a"})
	if err != nil || got.GetRun().GetState() != v1.RunState_RUN_STATE_PENDING {
		t.Errorf("run-a after run-b's attempts = %v, %v; want PENDING (no step recorded)", got.GetRun().GetState(), err)
	}

	// Health needs no credentials.
	h, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health Check without credentials = %v, %v; want SERVING", h.GetStatus(), err)
	}
}

// Several admin tokens from a file are all valid (rotation), alongside the
// environment's.
func TestAdminTokenFileRotation(t *testing.T) {
	file := filepath.Join(t.TempDir(), "admin-tokens")
	if err := os.WriteFile(file, []byte("# old and new\n"+adminToken+"\n"+adminToken2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCoordinator(t, nil, "--admin-token-file", file)
	runs := v1.NewRunServiceClient(dialWith(t, c.addr, nil))
	for _, tok := range []string{adminToken, adminToken2} {
		if _, err := runs.ListRuns(bearer(t.Context(), tok), &v1.ListRunsRequest{}); err != nil {
			t.Errorf("ListRuns with a token from the file: %v", err)
		}
	}
	_, err := runs.ListRuns(t.Context(), &v1.ListRunsRequest{})
	wantCode(t, "ListRuns without a token", err, codes.Unauthenticated)
}

// With no admin token RunService is open, but run tokens still rule
// WorkerService.
func TestNoAdminTokenOpensRunServiceOnly(t *testing.T) {
	c := startCoordinator(t, nil)
	conn := dialWith(t, c.addr, nil)
	runs, workers := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)
	a, err := runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "open", Spec: runSpec(1)})
	if err != nil {
		t.Fatalf("CreateRun without a token on an open coordinator: %v", err)
	}
	_, err = runs.GetRun(bearer(t.Context(), a.GetRunToken()), &v1.GetRunRequest{RunId: "open"})
	wantCode(t, "GetRun with a run token", err, codes.PermissionDenied)
	_, err = workers.RegisterWorker(t.Context(), &v1.RegisterWorkerRequest{RunId: "open", Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"})
	wantCode(t, "RegisterWorker without a token", err, codes.Unauthenticated)
	if !strings.Contains(c.logs.String(), "RunService is open") {
		t.Errorf("no warning that RunService is open:\n%s", c.logs)
	}
}

func TestServeRefusesOpenNonLoopbackListen(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"--listen", "0.0.0.0:0", "--metrics-listen", "", "--data-dir", t.TempDir()}
	code := runServe(t.Context(), args, noEnv, &stdout, &stderr)
	msg := stderr.String()
	if code != exitUsage || !strings.Contains(msg, "refusing to listen on 0.0.0.0:0") ||
		!strings.Contains(msg, "--insecure") || !strings.Contains(msg, "--admin-token-file") || !strings.Contains(msg, adminTokenEnv) {
		t.Errorf("serve --listen 0.0.0.0:0 = exit %d, stderr %q; want %d explaining the admin token and --insecure", code, msg, exitUsage)
	}

	tests := []struct {
		name   string
		cfg    serveConfig
		tokens int
		refuse bool
	}{
		{"loopback v4", serveConfig{Config: coordinator.Config{Listen: "127.0.0.1:7070"}}, 0, false},
		{"loopback v6", serveConfig{Config: coordinator.Config{Listen: "[::1]:7070"}}, 0, false},
		{"localhost", serveConfig{Config: coordinator.Config{Listen: "localhost:7070"}}, 0, false},
		{"all interfaces", serveConfig{Config: coordinator.Config{Listen: ":7070"}}, 0, true},
		{"v6 any", serveConfig{Config: coordinator.Config{Listen: "[::]:7070"}}, 0, true},
		{"a host name", serveConfig{Config: coordinator.Config{Listen: "coordinator.example:7070"}}, 0, true},
		{"a LAN address", serveConfig{Config: coordinator.Config{Listen: "10.1.2.3:7070"}}, 0, true},
		{"with an admin token", serveConfig{Config: coordinator.Config{Listen: "0.0.0.0:7070"}}, 1, false},
		{"with --insecure", serveConfig{Config: coordinator.Config{Listen: "0.0.0.0:7070", Insecure: true}}, 0, false},
		{"pprof on a non-loopback metrics address", serveConfig{Config: coordinator.Config{Listen: "0.0.0.0:7070", MetricsListen: "0.0.0.0:7071", Pprof: true}}, 1, true},
		{"pprof with --insecure", serveConfig{Config: coordinator.Config{Listen: "0.0.0.0:7070", MetricsListen: "0.0.0.0:7071", Pprof: true, Insecure: true}}, 0, false},
	}
	for _, tt := range tests {
		if err := tt.cfg.checkExposure(tt.tokens); (err != nil) != tt.refuse {
			t.Errorf("%s: checkExposure = %v, want refusal %v", tt.name, err, tt.refuse)
		}
	}
}

func TestSecurityFlagErrors(t *testing.T) {
	shortTokenFile := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(shortTokenFile, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"cert without key", []string{"--tls-cert", "c.pem"}, nil, "--tls-key"},
		{"client CA without TLS", []string{"--client-ca", "ca.pem"}, nil, "--client-ca"},
		{"bad reflection", []string{"--reflection", "sometimes"}, nil, "--reflection"},
		{"pprof without metrics", []string{"--pprof", "--metrics-listen", ""}, nil, "--pprof"},
		{"zero max runs", []string{"--max-runs", "0"}, nil, "--max-runs"},
		{"negative retention", []string{"--finished-run-retention", "-1h"}, nil, "--finished-run-retention"},
		{"negative run metrics retention", []string{"--run-metrics-retention", "-1h"}, nil, "--run-metrics-retention"},
		{"zero streams", []string{"--max-concurrent-streams", "0"}, nil, "--max-concurrent-streams"},
		{"tiny header list", []string{"--max-header-list-size", "100"}, nil, "--max-header-list-size"},
		{"short admin token in env", nil, map[string]string{adminTokenEnv: "short"}, adminTokenEnv},
		{"short admin token in file", []string{"--admin-token-file", shortTokenFile}, nil, "line 1"},
		{"missing token file", []string{"--admin-token-file", filepath.Join(t.TempDir(), "none")}, nil, "admin token file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runServe(t.Context(), tt.args, envMap(tt.env), &stdout, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("exit %d, stderr %q; want %d mentioning %s", code, stderr.String(), exitUsage, tt.want)
			}
			if strings.Contains(stderr.String(), "short\n") && tt.env != nil {
				t.Errorf("the error quotes the token: %q", stderr.String())
			}
		})
	}
}

func TestServeHelpListsSecurityAndLimitFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := runServe(t.Context(), []string{"--help"}, noEnv, &stdout, &stderr); code != exitOK {
		t.Fatalf("serve --help: exit %d", code)
	}
	for _, flag := range []string{"admin-token-file", "insecure", "tls-cert", "tls-key", "client-ca", "reflection",
		"metrics-listen", "pprof", "max-recv-msg-size", "max-header-list-size", "max-concurrent-streams", "max-runs", "max-workers-per-run",
		"max-events-per-run", "finished-run-retention", "run-metrics-retention", "keepalive-min-time", "keepalive-permit-without-stream", "keepalive-time", "keepalive-timeout", "max-connection-idle"} {
		if !strings.Contains(stdout.String(), "-"+flag) || !strings.Contains(stdout.String(), envName(flag)) {
			t.Errorf("help lacks -%s or %s", flag, envName(flag))
		}
	}
	for _, env := range []string{adminTokenEnv, "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if !strings.Contains(stdout.String(), env) {
			t.Errorf("help does not mention %s", env)
		}
	}
}

func TestTLSAndMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	t.Run("TLS", func(t *testing.T) {
		c := startCoordinator(t, nil, "--tls-cert", pki.serverCert, "--tls-key", pki.serverKey)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(dialWith(t, c.addr, pki.clientTLS(t, "", ""))).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check over TLS = %v, %v; want SERVING", resp.GetStatus(), err)
		}
		_, err = healthpb.NewHealthClient(dialWith(t, c.addr, nil)).Check(ctx, &healthpb.HealthCheckRequest{})
		wantCode(t, "plaintext client against a TLS server", err, codes.Unavailable)
	})

	t.Run("mutual TLS", func(t *testing.T) {
		c := startCoordinator(t, nil, "--tls-cert", pki.serverCert, "--tls-key", pki.serverKey, "--client-ca", pki.caFile)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(dialWith(t, c.addr, pki.clientTLS(t, pki.clientCert, pki.clientKey))).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check with a client certificate = %v, %v; want SERVING", resp.GetStatus(), err)
		}
		_, err = healthpb.NewHealthClient(dialWith(t, c.addr, pki.clientTLS(t, "", ""))).Check(ctx, &healthpb.HealthCheckRequest{})
		wantCode(t, "client without a certificate", err, codes.Unavailable)
		_, err = healthpb.NewHealthClient(dialWith(t, c.addr, pki.clientTLS(t, pki.rogueCert, pki.rogueKey))).Check(ctx, &healthpb.HealthCheckRequest{})
		wantCode(t, "client with a certificate from another CA", err, codes.Unavailable)
	})

	t.Run("bad key file", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		args := []string{"--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir(),
			"--tls-cert", pki.serverCert, "--tls-key", pki.clientKey}
		if code := runServe(t.Context(), args, noEnv, &stdout, &stderr); code != exitFail || !strings.Contains(stderr.String(), "TLS") {
			t.Errorf("mismatched key: exit %d, stderr %q; want %d naming TLS", code, stderr.String(), exitFail)
		}
	})
}

func TestLimitsFromFlags(t *testing.T) {
	c := startCoordinator(t, nil, "--max-recv-msg-size", "4096", "--max-header-list-size", "2048", "--max-runs", "1", "--max-workers-per-run", "1")
	conn := dialWith(t, c.addr, nil)
	runs, workers := v1.NewRunServiceClient(conn), v1.NewWorkerServiceClient(conn)

	_, err := runs.CancelRun(t.Context(), &v1.CancelRunRequest{RunId: "r", Reason: strings.Repeat("x", 8192)})
	wantCode(t, "an 8 KiB request with --max-recv-msg-size 4096", err, codes.ResourceExhausted)
	padded := metadata.AppendToOutgoingContext(t.Context(), "x-padding", strings.Repeat("x", 4096))
	if _, err = runs.ListRuns(padded, &v1.ListRunsRequest{}); err == nil || !strings.Contains(err.Error(), "2048") {
		t.Errorf("4 KiB of metadata with --max-header-list-size 2048: %v, want refused at 2048 bytes", err)
	}

	_, err = runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "too-wide", Spec: runSpec(2)})
	if wantCode(t, "2 ranks with --max-workers-per-run 1", err, codes.InvalidArgument); !strings.Contains(status.Convert(err).Message(), "max_workers_per_run") {
		t.Errorf("INVALID_ARGUMENT message %q does not name the limit", status.Convert(err).Message())
	}
	a, err := runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "only", Spec: runSpec(1)})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	_, err = runs.CreateRun(t.Context(), &v1.CreateRunRequest{RunId: "one-too-many", Spec: runSpec(1)})
	if wantCode(t, "second CreateRun with --max-runs 1", err, codes.ResourceExhausted); !strings.Contains(status.Convert(err).Message(), "max_runs") {
		t.Errorf("RESOURCE_EXHAUSTED message %q does not name the limit", status.Convert(err).Message())
	}
	asRun := bearer(t.Context(), a.GetRunToken())
	for i, role := range []v1.WorkerRole{v1.WorkerRole_WORKER_ROLE_TRAINER, v1.WorkerRole_WORKER_ROLE_ENVIRONMENT} {
		_, err := workers.RegisterWorker(asRun, &v1.RegisterWorkerRequest{RunId: "only", Role: role, Name: fmt.Sprintf("w-%d", i)})
		if i == 0 && err != nil {
			t.Fatalf("RegisterWorker: %v", err)
		}
		if i == 1 {
			if wantCode(t, "second worker with --max-workers-per-run 1", err, codes.ResourceExhausted); !strings.Contains(status.Convert(err).Message(), "max_workers_per_run") {
				t.Errorf("RESOURCE_EXHAUSTED message %q does not name the limit", status.Convert(err).Message())
			}
		}
	}
}

func TestReflectionModes(t *testing.T) {
	list := func(ctx context.Context, c *served) error {
		s, err := reflectionpb.NewServerReflectionClient(dialWith(t, c.addr, nil)).ServerReflectionInfo(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && err != io.EOF {
			return err
		}
		// A stream the server already ended fails Send with io.EOF; Recv
		// returns its status.
		_, err = s.Recv()
		return err
	}
	env := map[string]string{adminTokenEnv: adminToken}
	open := startCoordinator(t, env) // auto, on loopback: open
	wantCode(t, "reflection (auto, loopback) without a token", list(t.Context(), open), codes.OK)
	authed := startCoordinator(t, env, "--reflection", "auth")
	wantCode(t, "reflection (auth) without a token", list(t.Context(), authed), codes.Unauthenticated)
	wantCode(t, "reflection (auth) with the admin token", list(bearer(t.Context(), adminToken), authed), codes.OK)
	off := startCoordinator(t, env, "--reflection", "off")
	wantCode(t, "reflection (off)", list(bearer(t.Context(), adminToken), off), codes.Unimplemented)

	for _, tt := range []struct {
		reflection, listen string
		serve, open        bool
	}{
		{"auto", "127.0.0.1:7070", true, true},
		{"auto", "0.0.0.0:7070", true, false},
		{"open", "0.0.0.0:7070", true, true},
		{"auth", "127.0.0.1:7070", true, false},
		{"off", "127.0.0.1:7070", false, false},
	} {
		serve, open := coordinator.Config{Reflection: coordinator.Reflection(tt.reflection), Listen: tt.listen}.ReflectionAccess()
		if serve != tt.serve || open != tt.open {
			t.Errorf("--reflection %s on %s: serve %v open %v, want %v %v", tt.reflection, tt.listen, serve, open, tt.serve, tt.open)
		}
	}
}
