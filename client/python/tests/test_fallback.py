"""Falling back to long polling when the stream is refused, against a
hand-written fake coordinator (the real one always serves streams)."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
from google.protobuf import duration_pb2

import snapcoord
from snapcoord import CommandKind
from snapcoord.v1 import run_pb2, worker_pb2, worker_service_pb2 as ws, worker_service_pb2_grpc


class NoStreams(worker_service_pb2_grpc.WorkerServiceServicer):
    """A coordinator behind a proxy that does not pass server streams."""

    def __init__(self) -> None:
        self.streams = 0
        self.polls: list[int] = []  # after_seq of each poll
        self.lock = threading.Lock()

    def RegisterWorker(self, request, context):  # type: ignore[no-untyped-def]
        return ws.RegisterWorkerResponse(
            worker_id="w-1", incarnation=1, run_state=run_pb2.RUN_STATE_RUNNING, last_command_seq=4, resume_after_seq=4,
            heartbeat_interval=duration_pb2.Duration(seconds=5), lease_ttl=duration_pb2.Duration(seconds=15),
        )  # fmt: skip

    def StreamCommands(self, request, context):  # type: ignore[no-untyped-def]
        with self.lock:
            self.streams += 1
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "streams are not passed")

    def PollCommands(self, request, context):  # type: ignore[no-untyped-def]
        with self.lock:
            self.polls.append(request.after_seq)
        if request.after_seq < 5:
            snap = worker_pb2.SnapshotCommand(snapshot_id="snap-1", reason=worker_pb2.SNAPSHOT_REASON_INTERVAL)
            return ws.PollCommandsResponse(commands=[worker_pb2.Command(seq=5, snapshot=snap)], run_state=run_pb2.RUN_STATE_RUNNING)
        stop = worker_pb2.Command(seq=6, stop=worker_pb2.StopCommand(reason="STOPPED: test"))
        return ws.PollCommandsResponse(commands=[stop], run_state=run_pb2.RUN_STATE_STOPPED)

    def DeregisterWorker(self, request, context):  # type: ignore[no-untyped-def]
        return ws.DeregisterWorkerResponse()


def test_falls_back_to_polling_when_streams_are_refused() -> None:
    fake = NoStreams()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        client = snapcoord.connect(f"127.0.0.1:{port}", plaintext=True, run_id="run-a", run_token="t" * 20, env={})
        with client.env_worker("env-0") as worker:
            kinds = [(c.kind, c.seq) for c in worker.commands()]
            assert kinds == [(CommandKind.SNAPSHOT, 5), (CommandKind.STOP, 6)]
            assert worker.polling
        # One refused stream, then polls resuming after the last delivered command.
        assert fake.streams == 1
        assert fake.polls == [4, 5]
        client.close()
    finally:
        server.stop(None)
