package grpcserver_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/snapcoord/snapcoord/api/snapcoord/v1"
)

// Every RPC reaches the engine through the production chain and maps its
// error: none answers UNIMPLEMENTED; an unknown run is NOT_FOUND on
// RunService, and on WorkerService (whose run token names a run that
// exists) an unknown worker is NOT_FOUND, while registering succeeds.
func TestEveryRPCIsWired(t *testing.T) {
	ts := newTestServer(t)
	const run, wired, worker = "no-such-run", "wired", "w-1"
	createRun(t, ts, wired) // WorkerService calls now carry its token
	rpcs := map[string]func(ctx context.Context) error{
		"GetRun": func(ctx context.Context) error {
			_, err := ts.runs.GetRun(ctx, &v1.GetRunRequest{RunId: run})
			return err
		},
		"UpdateDeadline": func(ctx context.Context) error {
			_, err := ts.runs.UpdateDeadline(ctx, &v1.UpdateDeadlineRequest{RunId: run, CheckpointMustSaveBy: "00:01:00:00"})
			return err
		},
		"TriggerDeadline": func(ctx context.Context) error {
			_, err := ts.runs.TriggerDeadline(ctx, &v1.TriggerDeadlineRequest{RunId: run})
			return err
		},
		"CancelRun": func(ctx context.Context) error {
			_, err := ts.runs.CancelRun(ctx, &v1.CancelRunRequest{RunId: run})
			return err
		},
		"WatchRun": func(ctx context.Context) error {
			s, err := ts.runs.WatchRun(ctx, &v1.WatchRunRequest{RunId: run})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		},
		"ListWorkers": func(ctx context.Context) error {
			_, err := ts.runs.ListWorkers(ctx, &v1.ListWorkersRequest{RunId: run})
			return err
		},
		"ListSnapshots": func(ctx context.Context) error {
			_, err := ts.runs.ListSnapshots(ctx, &v1.ListSnapshotsRequest{RunId: run})
			return err
		},
		"RegisterWorker": func(ctx context.Context) error {
			_, err := ts.workers.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: wired, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "rank-0"})
			if err == nil {
				// Registered: the engine answered. It refuses another
				// name for the same live rank with ALREADY_EXISTS.
				_, err = ts.workers.RegisterWorker(ctx, &v1.RegisterWorkerRequest{RunId: wired, Role: v1.WorkerRole_WORKER_ROLE_TRAINER, Name: "usurper"})
			}
			return err
		},
		"Heartbeat": func(ctx context.Context) error {
			_, err := ts.workers.Heartbeat(ctx, &v1.HeartbeatRequest{RunId: wired, WorkerId: worker})
			return err
		},
		"DeregisterWorker": func(ctx context.Context) error {
			_, err := ts.workers.DeregisterWorker(ctx, &v1.DeregisterWorkerRequest{RunId: wired, WorkerId: worker})
			return err
		},
		"CompleteStep": func(ctx context.Context) error {
			_, err := ts.workers.CompleteStep(ctx, &v1.CompleteStepRequest{RunId: wired, WorkerId: worker, Step: 1})
			return err
		},
		"ReportCheckpoint": func(ctx context.Context) error {
			_, err := ts.workers.ReportCheckpoint(ctx, &v1.ReportCheckpointRequest{
				RunId: wired, WorkerId: worker, Step: 1, Phase: v1.CheckpointPhase_CHECKPOINT_PHASE_SAVED,
			})
			return err
		},
		"ReportSnapshot": func(ctx context.Context) error {
			_, err := ts.workers.ReportSnapshot(ctx, &v1.ReportSnapshotRequest{
				RunId: wired, WorkerId: worker, SnapshotId: "s-1", Outcome: v1.SnapshotOutcome_SNAPSHOT_OUTCOME_SAVED,
			})
			return err
		},
		"FinishRun": func(ctx context.Context) error {
			_, err := ts.workers.FinishRun(ctx, &v1.FinishRunRequest{RunId: wired, WorkerId: worker})
			return err
		},
		"StreamCommands": func(ctx context.Context) error {
			s, err := ts.workers.StreamCommands(ctx, &v1.StreamCommandsRequest{RunId: wired, WorkerId: worker})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		},
		"PollCommands": func(ctx context.Context) error {
			_, err := ts.workers.PollCommands(ctx, &v1.PollCommandsRequest{RunId: wired, WorkerId: worker})
			return err
		},
	}
	for name, call := range rpcs {
		t.Run(name, func(t *testing.T) {
			want := codes.NotFound
			if name == "RegisterWorker" {
				want = codes.AlreadyExists
			}
			if err := call(t.Context()); status.Code(err) != want {
				t.Errorf("%s(unknown run or worker) = %v, want %v", name, err, want)
			}
		})
	}
}
