package auth

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	adminA  = "admin-token-aaaaaaaaaaaaaaaa"
	adminB  = "admin-token-bbbbbbbbbbbbbbbb" // a second, rotated-in token
	tokRunA = "scr_token-of-run-a"
	tokRunB = "scr_token-of-run-b"
)

type fakeRuns map[string]string

func (f fakeRuns) RunForToken(tok string) (string, bool) {
	run, ok := f[tok]
	return run, ok
}

var testRuns = fakeRuns{tokRunA: "run-a", tokRunB: "run-b"}

// The fakes answer OK for the methods the tests call; any other method
// answers UNIMPLEMENTED, which still proves that authentication let it by.
type fakeRunService struct {
	v1.UnimplementedRunServiceServer
}

func (fakeRunService) GetRun(_ context.Context, req *v1.GetRunRequest) (*v1.GetRunResponse, error) {
	return &v1.GetRunResponse{Run: &v1.Run{RunId: req.GetRunId()}}, nil
}

func (fakeRunService) WatchRun(req *v1.WatchRunRequest, s grpc.ServerStreamingServer[v1.WatchRunResponse]) error {
	return s.Send(&v1.WatchRunResponse{Event: &v1.RunEvent{Seq: 1}})
}

type fakeWorkerService struct {
	v1.UnimplementedWorkerServiceServer
}

func (fakeWorkerService) Heartbeat(ctx context.Context, req *v1.HeartbeatRequest) (*v1.HeartbeatResponse, error) {
	if run, _ := RunFromContext(ctx); run != req.GetRunId() {
		return nil, status.Error(codes.Internal, "handler reached with the wrong scope")
	}
	return &v1.HeartbeatResponse{}, nil
}

func (fakeWorkerService) StreamCommands(req *v1.StreamCommandsRequest, s grpc.ServerStreamingServer[v1.StreamCommandsResponse]) error {
	return s.Send(&v1.StreamCommandsResponse{Command: &v1.Command{Seq: 1}})
}

type clients struct {
	runs    v1.RunServiceClient
	workers v1.WorkerServiceClient
	health  healthpb.HealthClient
	refl    reflectionpb.ServerReflectionClient
}

func serve(t *testing.T, opts Options) clients {
	t.Helper()
	if opts.Runs == nil {
		opts.Runs = testRuns
	}
	a, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(a.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(a.StreamServerInterceptor()))
	v1.RegisterRunServiceServer(srv, fakeRunService{})
	v1.RegisterWorkerServiceServer(srv, fakeWorkerService{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	reflection.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
	})
	return clients{
		runs: v1.NewRunServiceClient(conn), workers: v1.NewWorkerServiceClient(conn),
		health: healthpb.NewHealthClient(conn), refl: reflectionpb.NewServerReflectionClient(conn),
	}
}

// withAuth sends an authorization header; "" sends none.
func withAuth(ctx context.Context, header string) context.Context {
	if header == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", header)
}

func bearerOf(tok string) string { return "Bearer " + tok }

func wantCode(t *testing.T, what string, err error, want codes.Code, secret string) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
	if secret != "" && err != nil && strings.Contains(err.Error(), secret) {
		t.Errorf("%s: the error quotes the token: %v", what, err)
	}
}

func TestRunServiceNeedsAnAdminToken(t *testing.T) {
	c := serve(t, Options{AdminTokens: []string{adminA, adminB}})
	tests := []struct {
		name, header string
		want         codes.Code
	}{
		{"no credentials", "", codes.Unauthenticated},
		{"garbage token", bearerOf("garbage-garbage-garbage"), codes.Unauthenticated},
		{"not bearer", "Basic " + adminA, codes.Unauthenticated},
		{"bearer without token", "Bearer ", codes.Unauthenticated},
		{"admin token", bearerOf(adminA), codes.OK},
		{"rotated admin token", bearerOf(adminB), codes.OK},
		{"scheme is case-insensitive", "bearer " + adminA, codes.OK},
		{"run token", bearerOf(tokRunA), codes.PermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := withAuth(t.Context(), tt.header)
			_, err := c.runs.GetRun(ctx, &v1.GetRunRequest{RunId: "run-a"})
			wantCode(t, "GetRun", err, tt.want, strings.TrimPrefix(tt.header, "Bearer "))
			// The streaming method follows the same rule.
			stream, err := c.runs.WatchRun(ctx, &v1.WatchRunRequest{RunId: "run-a"})
			if err == nil {
				_, err = stream.Recv()
			}
			wantCode(t, "WatchRun", err, tt.want, "")
		})
	}
}

func TestWorkerServiceNeedsTheRunsToken(t *testing.T) {
	c := serve(t, Options{AdminTokens: []string{adminA}})
	tests := []struct {
		name, header string
		want         codes.Code
	}{
		{"no credentials", "", codes.Unauthenticated},
		{"garbage token", bearerOf("garbage-garbage-garbage"), codes.Unauthenticated},
		{"malformed", tokRunA, codes.Unauthenticated},
		{"admin token", bearerOf(adminA), codes.PermissionDenied},
		{"token of another run", bearerOf(tokRunB), codes.PermissionDenied},
		{"token of this run", bearerOf(tokRunA), codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := withAuth(t.Context(), tt.header)
			_, err := c.workers.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: "run-a", WorkerId: "w-1"})
			wantCode(t, "Heartbeat", err, tt.want, strings.TrimPrefix(tt.header, "Bearer "))
			stream, err := c.workers.StreamCommands(ctx, &v1.StreamCommandsRequest{RunId: "run-a", WorkerId: "w-1"})
			if err == nil {
				_, err = stream.Recv()
			}
			wantCode(t, "StreamCommands", err, tt.want, "")
		})
	}
}

// A run token used on another run is refused with a message that names the
// field and quotes the run id bounded: the check runs before validation,
// and the message goes into the call's log line.
func TestRunTokenOnAnotherRunQuotesItBounded(t *testing.T) {
	c := serve(t, Options{AdminTokens: []string{adminA}})
	huge := strings.Repeat("z", 512<<10)
	_, err := c.workers.Heartbeat(withAuth(t.Context(), bearerOf(tokRunA)), &v1.HeartbeatRequest{RunId: huge, WorkerId: "w-1"})
	wantCode(t, "Heartbeat of another run", err, codes.PermissionDenied, tokRunA)
	msg := status.Convert(err).Message()
	if len(msg) > 300 || !strings.HasPrefix(msg, "run_id: ") || !strings.Contains(msg, fmt.Sprintf("(%d bytes)", len(huge))) {
		t.Errorf("message of %d bytes: %.300q", len(msg), msg)
	}
}

// With no admin token RunService is open, but a worker's token is still
// refused there, and WorkerService still needs run tokens.
func TestOpenRunServiceInDevelopmentMode(t *testing.T) {
	c := serve(t, Options{})
	for _, header := range []string{"", bearerOf("some-other-coordinators-admin-token")} {
		if _, err := c.runs.GetRun(withAuth(t.Context(), header), &v1.GetRunRequest{RunId: "run-a"}); err != nil {
			t.Errorf("GetRun with %q: %v, want OK", header, err)
		}
	}
	_, err := c.runs.GetRun(withAuth(t.Context(), bearerOf(tokRunA)), &v1.GetRunRequest{RunId: "run-a"})
	wantCode(t, "GetRun with a run token", err, codes.PermissionDenied, tokRunA)
	_, err = c.workers.Heartbeat(t.Context(), &v1.HeartbeatRequest{RunId: "run-a", WorkerId: "w-1"})
	wantCode(t, "Heartbeat without a token", err, codes.Unauthenticated, "")
}

func TestHealthIsOpenAndReflectionAsConfigured(t *testing.T) {
	for _, open := range []bool{true, false} {
		c := serve(t, Options{AdminTokens: []string{adminA}, OpenReflection: open})
		if _, err := c.health.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("health Check without credentials: %v", err)
		}
		listServices := func(ctx context.Context) error {
			s, err := c.refl.ServerReflectionInfo(ctx)
			if err != nil {
				return err
			}
			if err := s.Send(&reflectionpb.ServerReflectionRequest{
				MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
			}); err != nil && err != io.EOF {
				return err
			}
			// A stream the server already ended fails Send with io.EOF;
			// Recv returns its status.
			_, err = s.Recv()
			return err
		}
		want := codes.OK
		if !open {
			want = codes.Unauthenticated
		}
		wantCode(t, "reflection without credentials", listServices(t.Context()), want, "")
		wantCode(t, "reflection with an admin token", listServices(withAuth(t.Context(), bearerOf(adminA))), codes.OK, "")
	}
}

// The table covers every method by full name; a method it does not know
// needs an admin token.
func TestMethodTable(t *testing.T) {
	a, err := New(Options{Runs: testRuns})
	if err != nil {
		t.Fatal(err)
	}
	check := func(sd *grpc.ServiceDesc, want Access) {
		for _, m := range sd.Methods {
			if got := a.Access("/" + sd.ServiceName + "/" + m.MethodName); got != want {
				t.Errorf("%s/%s: %v, want %v", sd.ServiceName, m.MethodName, got, want)
			}
		}
		for _, s := range sd.Streams {
			if got := a.Access("/" + sd.ServiceName + "/" + s.StreamName); got != want {
				t.Errorf("%s/%s: %v, want %v", sd.ServiceName, s.StreamName, got, want)
			}
		}
	}
	check(&v1.RunService_ServiceDesc, Admin)
	check(&v1.WorkerService_ServiceDesc, RunToken)
	check(&healthpb.Health_ServiceDesc, Open)
	check(&reflectionpb.ServerReflection_ServiceDesc, Admin)
	for _, m := range []string{"/snapcoord.v1.RunServiceX/GetRun", "/snapcoord.v1.WorkerService/GetRunX", "/unknown.Service/Method", ""} {
		if got := a.Access(m); got != Admin {
			t.Errorf("Access(%q) = %v, want admin", m, got)
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without Runs: no error")
	}
	for _, tok := range []string{"", "has space-in-the-middle-here"} {
		if _, err := New(Options{Runs: testRuns, AdminTokens: []string{tok}}); err == nil {
			t.Errorf("New with admin token %q: no error", tok)
		}
	}
}

func TestReadAdminTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := ReadAdminTokens(write("ok", "# rotated in on Monday\n"+adminA+"\n\n  "+adminB+"  \r\n"))
	if err != nil || len(got) != 2 || got[0] != adminA || got[1] != adminB {
		t.Errorf("ReadAdminTokens = %q, %v; want both tokens", got, err)
	}
	for name, content := range map[string]string{
		"empty":      "# nothing here\n\n",
		"short":      "tooshort\n",
		"whitespace": "admin token with spaces inside\n",
	} {
		_, err := ReadAdminTokens(write("file-"+name, content))
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if name != "empty" && strings.Contains(err.Error(), strings.TrimSpace(content)) {
			t.Errorf("%s: the error quotes the token: %v", name, err)
		}
	}
	if _, err := ReadAdminTokens(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file: no error")
	}
}

const viewerV = "viewer-token-vvvvvvvvvvvvvvvv"

// A viewer token opens no RPC, unary or streaming, on either service, even
// with no admin token configured (RunService otherwise open); the status
// page's rule admits it, and an admin token, and refuses a run token.
func TestViewerTokenOpensOnlyThePage(t *testing.T) {
	for _, admins := range [][]string{{adminA}, nil} {
		opts := Options{AdminTokens: admins, ViewerTokens: []string{viewerV}}
		c := serve(t, opts)
		ctx := withAuth(t.Context(), bearerOf(viewerV))
		_, err := c.runs.GetRun(ctx, &v1.GetRunRequest{RunId: "run-a"})
		wantCode(t, fmt.Sprintf("GetRun, %d admin tokens", len(admins)), err, codes.PermissionDenied, viewerV)
		stream, err := c.runs.WatchRun(ctx, &v1.WatchRunRequest{RunId: "run-a"})
		if err == nil {
			_, err = stream.Recv()
		}
		wantCode(t, "WatchRun", err, codes.PermissionDenied, viewerV)
		_, err = c.workers.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: "run-a", WorkerId: "w"})
		wantCode(t, "Heartbeat", err, codes.PermissionDenied, viewerV)

		a, err := New(Options{AdminTokens: admins, ViewerTokens: []string{viewerV}, Runs: testRuns})
		if err != nil {
			t.Fatal(err)
		}
		adminGets := codes.OK // an admin token, when admin tokens are configured
		if len(admins) == 0 {
			adminGets = codes.Unauthenticated // an unknown token, then
		}
		for _, tc := range []struct {
			token   string
			present bool
			want    codes.Code
		}{
			{"", false, codes.Unauthenticated},
			{"garbage-garbage-garbage", true, codes.Unauthenticated},
			{viewerV, true, codes.OK},
			{adminA, true, adminGets},
			{tokRunA, true, codes.PermissionDenied},
		} {
			if got := status.Code(a.CheckViewer(tc.token, tc.present)); got != tc.want {
				t.Errorf("CheckViewer(%q), %d admin tokens: %v, want %v", tc.token, len(admins), got, tc.want)
			}
		}
	}
	// With neither kind configured the page is open, as RunService is.
	a, err := New(Options{Runs: testRuns})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CheckViewer("", false); err != nil {
		t.Errorf("CheckViewer with no token configured: %v, want open", err)
	}
}
