package transport

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// RunServer serves snapcoord.v1.RunService.
type RunServer struct {
	// Embedded so that methods added to the proto answer UNIMPLEMENTED
	// instead of breaking the build.
	v1.UnimplementedRunServiceServer
	engines Engines
	log     *slog.Logger
}

// NewRunServer returns a RunService backed by the engines; log receives internal errors.
func NewRunServer(engines Engines, log *slog.Logger) *RunServer {
	return &RunServer{engines: engines, log: log}
}

func (s *RunServer) CreateRun(ctx context.Context, req *v1.CreateRunRequest) (*v1.CreateRunResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).CreateRun)
}

func (s *RunServer) GetRun(ctx context.Context, req *v1.GetRunRequest) (*v1.GetRunResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).GetRun)
}

func (s *RunServer) ListRuns(ctx context.Context, req *v1.ListRunsRequest) (*v1.ListRunsResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).ListRuns)
}

func (s *RunServer) UpdateDeadline(ctx context.Context, req *v1.UpdateDeadlineRequest) (*v1.UpdateDeadlineResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).UpdateDeadline)
}

func (s *RunServer) TriggerDeadline(ctx context.Context, req *v1.TriggerDeadlineRequest) (*v1.TriggerDeadlineResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).TriggerDeadline)
}

func (s *RunServer) CancelRun(ctx context.Context, req *v1.CancelRunRequest) (*v1.CancelRunResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).CancelRun)
}

func (s *RunServer) WatchRun(req *v1.WatchRunRequest, stream grpc.ServerStreamingServer[v1.WatchRunResponse]) error {
	send := func(ev *v1.RunEvent) error { return sendWrapped(stream, &v1.WatchRunResponse{Event: ev}) }
	return toStatus(stream.Context(), s.log, s.engines.For(stream.Context()).WatchRun(stream.Context(), req, send))
}

func (s *RunServer) ListWorkers(ctx context.Context, req *v1.ListWorkersRequest) (*v1.ListWorkersResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).ListWorkers)
}

func (s *RunServer) ListSnapshots(ctx context.Context, req *v1.ListSnapshotsRequest) (*v1.ListSnapshotsResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).ListSnapshots)
}

func (s *RunServer) ReissueRunToken(ctx context.Context, req *v1.ReissueRunTokenRequest) (*v1.ReissueRunTokenResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).ReissueRunToken)
}

// unary calls one engine method and maps its error: the whole body of every
// unary handler, so none of them can forget the mapping.
func unary[Req, Resp any](ctx context.Context, log *slog.Logger, req Req,
	call func(context.Context, Req) (Resp, error),
) (Resp, error) {
	ctx, cancel := answerInTime(ctx)
	defer cancel()
	resp, err := call(ctx, req)
	if err != nil {
		var zero Resp
		return zero, toStatus(ctx, log, err)
	}
	return resp, nil
}

// sendWrapped sends one stream message, marking a failure as the transport's
// own so that toStatus passes it through rather than calling it internal.
func sendWrapped[T any](stream grpc.ServerStreamingServer[T], msg *T) error {
	if err := stream.Send(msg); err != nil {
		return sendError{err}
	}
	return nil
}
