package transport

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// WorkerServer serves snapcoord.v1.WorkerService.
type WorkerServer struct {
	// Embedded so that methods added to the proto answer UNIMPLEMENTED
	// instead of breaking the build.
	v1.UnimplementedWorkerServiceServer
	engines Engines
	log     *slog.Logger
}

// NewWorkerServer returns a WorkerService backed by the engines; log receives
// internal errors.
func NewWorkerServer(engines Engines, log *slog.Logger) *WorkerServer {
	return &WorkerServer{engines: engines, log: log}
}

func (s *WorkerServer) RegisterWorker(ctx context.Context, req *v1.RegisterWorkerRequest) (*v1.RegisterWorkerResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).RegisterWorker)
}

func (s *WorkerServer) Heartbeat(ctx context.Context, req *v1.HeartbeatRequest) (*v1.HeartbeatResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).Heartbeat)
}

func (s *WorkerServer) DeregisterWorker(ctx context.Context, req *v1.DeregisterWorkerRequest) (*v1.DeregisterWorkerResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).DeregisterWorker)
}

func (s *WorkerServer) CompleteStep(ctx context.Context, req *v1.CompleteStepRequest) (*v1.CompleteStepResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).CompleteStep)
}

func (s *WorkerServer) ReportCheckpoint(ctx context.Context, req *v1.ReportCheckpointRequest) (*v1.ReportCheckpointResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).ReportCheckpoint)
}

func (s *WorkerServer) ReportSnapshot(ctx context.Context, req *v1.ReportSnapshotRequest) (*v1.ReportSnapshotResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).ReportSnapshot)
}

func (s *WorkerServer) FinishRun(ctx context.Context, req *v1.FinishRunRequest) (*v1.FinishRunResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).FinishRun)
}

func (s *WorkerServer) StreamCommands(req *v1.StreamCommandsRequest, stream grpc.ServerStreamingServer[v1.StreamCommandsResponse]) error {
	send := func(c *v1.Command) error { return sendWrapped(stream, &v1.StreamCommandsResponse{Command: c}) }
	return toStatus(stream.Context(), s.log, s.engines.For(stream.Context()).StreamCommands(stream.Context(), req, send))
}

func (s *WorkerServer) PollCommands(ctx context.Context, req *v1.PollCommandsRequest) (*v1.PollCommandsResponse, error) {
	return unary(ctx, s.log, req, s.engines.For(ctx).PollCommands)
}
