package engine

import (
	"context"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// The methods below are the engine's whole surface. Each takes the RPC's
// request message (already checked field by field by protovalidate) and
// returns its response, so a gRPC handler is one call plus error mapping.
// Every method that changes state returns only after the change is durable.

// RunService

func (e *Engine) CreateRun(ctx context.Context, req *v1.CreateRunRequest) (*v1.CreateRunResponse, error) {
	return e.createRun(ctx, req)
}

func (e *Engine) GetRun(ctx context.Context, req *v1.GetRunRequest) (*v1.GetRunResponse, error) {
	run, err := e.viewRun(ctx, req.GetRunId())
	if err != nil {
		return nil, err
	}
	return &v1.GetRunResponse{Run: run}, nil
}

func (e *Engine) ListRuns(ctx context.Context, req *v1.ListRunsRequest) (*v1.ListRunsResponse, error) {
	return e.listRuns(ctx, req)
}

func (e *Engine) UpdateDeadline(ctx context.Context, req *v1.UpdateDeadlineRequest) (*v1.UpdateDeadlineResponse, error) {
	run, err := e.updateDeadline(ctx, req)
	if err != nil {
		return nil, err
	}
	return &v1.UpdateDeadlineResponse{Run: run}, nil
}

func (e *Engine) TriggerDeadline(ctx context.Context, req *v1.TriggerDeadlineRequest) (*v1.TriggerDeadlineResponse, error) {
	run, err := e.triggerDeadline(ctx, req)
	if err != nil {
		return nil, err
	}
	return &v1.TriggerDeadlineResponse{Run: run}, nil
}

func (e *Engine) CancelRun(ctx context.Context, req *v1.CancelRunRequest) (*v1.CancelRunResponse, error) {
	run, err := e.cancelRun(ctx, req)
	if err != nil {
		return nil, err
	}
	return &v1.CancelRunResponse{Run: run}, nil
}

func (e *Engine) ReissueRunToken(ctx context.Context, req *v1.ReissueRunTokenRequest) (*v1.ReissueRunTokenResponse, error) {
	return e.reissueRunToken(ctx, req)
}

// WatchRun calls send for each event after req.after_seq until the run is
// terminal and every event was sent, ctx ends, or (with no_follow) the
// backlog was sent. An after_seq past the run's last event is
// ErrOutOfRange.
func (e *Engine) WatchRun(ctx context.Context, req *v1.WatchRunRequest, send func(*v1.RunEvent) error) error {
	return e.watchRun(ctx, req, send)
}

func (e *Engine) ListWorkers(ctx context.Context, req *v1.ListWorkersRequest) (*v1.ListWorkersResponse, error) {
	return e.listWorkers(ctx, req)
}

func (e *Engine) ListSnapshots(ctx context.Context, req *v1.ListSnapshotsRequest) (*v1.ListSnapshotsResponse, error) {
	return e.listSnapshots(ctx, req)
}

// WorkerService

func (e *Engine) RegisterWorker(ctx context.Context, req *v1.RegisterWorkerRequest) (*v1.RegisterWorkerResponse, error) {
	return e.registerWorker(ctx, req)
}

func (e *Engine) Heartbeat(ctx context.Context, req *v1.HeartbeatRequest) (*v1.HeartbeatResponse, error) {
	return e.heartbeat(ctx, req)
}

func (e *Engine) DeregisterWorker(ctx context.Context, req *v1.DeregisterWorkerRequest) (*v1.DeregisterWorkerResponse, error) {
	return e.deregisterWorker(ctx, req)
}

func (e *Engine) CompleteStep(ctx context.Context, req *v1.CompleteStepRequest) (*v1.CompleteStepResponse, error) {
	return e.completeStep(ctx, req)
}

func (e *Engine) ReportCheckpoint(ctx context.Context, req *v1.ReportCheckpointRequest) (*v1.ReportCheckpointResponse, error) {
	return e.reportCheckpoint(ctx, req)
}

func (e *Engine) ReportSnapshot(ctx context.Context, req *v1.ReportSnapshotRequest) (*v1.ReportSnapshotResponse, error) {
	return e.reportSnapshot(ctx, req)
}

func (e *Engine) FinishRun(ctx context.Context, req *v1.FinishRunRequest) (*v1.FinishRunResponse, error) {
	return e.finishRun(ctx, req)
}

// StreamCommands calls send for each command for the worker's role after
// req.after_seq, then for new ones, until a Stop was sent, the worker
// re-registers (ErrFailedPrecondition), or ctx ends. An after_seq past the
// run's last command is ErrOutOfRange, here and in PollCommands.
func (e *Engine) StreamCommands(ctx context.Context, req *v1.StreamCommandsRequest, send func(*v1.Command) error) error {
	return e.streamCommands(ctx, req, send)
}

// PollCommands returns pending commands at once, or waits up to the capped
// wait for the first one.
func (e *Engine) PollCommands(ctx context.Context, req *v1.PollCommandsRequest) (*v1.PollCommandsResponse, error) {
	return e.pollCommands(ctx, req)
}
