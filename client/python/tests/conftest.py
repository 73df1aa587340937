"""Fixtures: the real ``snapcoord serve`` binary on a free loopback port.

The binary is $SNAPCOORD_BIN (``make test`` passes bin/snapcoord), else the
checkout's bin/snapcoord, else one built into the session's temporary
directory with ``go build``.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import time
from typing import Callable, Iterator, Optional

import grpc
import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]

# The package under test is the one this Python imports: `make test-python`
# installs client/python into a venv and runs the tests with it, as a user
# would have it; PYTHONPATH=client/python tests the source tree instead.
try:
    import snapcoord
    from snapcoord.v1 import run_pb2
except ModuleNotFoundError as err:
    raise ImportError(
        f"{err}: the tests import snapcoord as installed: run them with `make test-python PYTEST_ARGS=...`, "
        "or set PYTHONPATH=client/python to test the source tree"
    ) from err

# Short leases keep the suite fast: a worker heartbeats 4 times a second and
# is LOST 2 s after its last one (and gets 2 s after a coordinator restart).
HEARTBEAT = "250ms"
LEASE = "2s"
_SERVING = b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, cond: Callable[[], bool], timeout: float = 15.0) -> None:
    """Asks cond until it holds; fails the test naming what was awaited."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Coordinator:
    """One ``snapcoord serve`` process; restartable on the same data and port."""

    def __init__(
        self,
        binary: str,
        data_dir: pathlib.Path,
        args: tuple[str, ...] = (),
        credentials: Optional[grpc.ChannelCredentials] = None,
        server_name: str = "",
    ) -> None:
        """``credentials`` (and the ``server_name`` in its certificate) is
        how to reach a coordinator started with --tls-cert."""
        self.binary, self.data_dir, self.args = binary, data_dir, args
        self.credentials, self.server_name = credentials, server_name
        self.addr = f"127.0.0.1:{free_port()}"
        self.log_path = data_dir / "coordinator.log"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.start()

    def start(self) -> None:
        cmd = [
            self.binary, "serve", "--listen", self.addr, "--data-dir", str(self.data_dir), "--metrics-listen", "",
            "--heartbeat-interval", HEARTBEAT, "--lease-ttl", LEASE, *self.args,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SNAPCOORD_", "OTEL_"))}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        self._await_serving()

    def _await_serving(self, timeout: float = 30.0) -> None:
        fast = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.max_reconnect_backoff_ms", 100)]
        if self.credentials is not None:
            fast.append(("grpc.ssl_target_name_override", self.server_name))
            channel = grpc.secure_channel(self.addr, self.credentials, options=fast)
        else:
            channel = grpc.insecure_channel(self.addr, options=fast)
        with channel as ch:
            check = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda _: b"", response_deserializer=bytes)
            end = time.monotonic() + timeout
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    pytest.fail(f"snapcoord exited {self.proc.returncode} before serving:\n{self.log_tail()}")
                try:
                    if check(None, timeout=1.0, wait_for_ready=True) == _SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > end:
                    pytest.fail(f"snapcoord did not report SERVING within {timeout}s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is drained."""
        assert self.proc is not None and self.proc.poll() is None, "snapcoord had already exited"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def admin(self) -> snapcoord.Client:
        """A client for RunService (no admin token is configured: loopback is open)."""
        return snapcoord.connect(self.addr, plaintext=True, timeout=10.0, env={})

    def worker_client(self, run_id: str, run_token: str) -> snapcoord.Client:
        return snapcoord.connect(self.addr, plaintext=True, run_id=run_id, run_token=run_token, timeout=10.0, env={})


@pytest.fixture(scope="session")
def snapcoord_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    if os.environ.get("SNAPCOORD_BIN"):
        return os.environ["SNAPCOORD_BIN"]
    built = REPO / "bin" / "snapcoord"
    if built.exists():
        return str(built)
    out = tmp_path_factory.mktemp("bin") / "snapcoord"
    env = dict(os.environ, GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "go1.27.3"))
    subprocess.run(["go", "build", "-o", str(out), "./cmd/snapcoord"], cwd=REPO, env=env, check=True)
    return str(out)


@pytest.fixture
def coordinator(snapcoord_bin: str, tmp_path: pathlib.Path) -> Iterator[Coordinator]:
    c = Coordinator(snapcoord_bin, tmp_path)
    yield c
    c.stop()


def run_spec(
    world_size: int,
    budget: Optional[str] = None,
    must_save_by: Optional[float] = None,
    *,
    snapshots: bool = True,
    checkpoint_prior: float = 0.5,
    snapshot_prior: float = 0.5,
    margin: float = 0.5,
) -> run_pb2.RunSpec:
    """A spec with priors for C and R; B as a budget or an absolute epoch time."""
    spec = run_pb2.RunSpec(trainer_world_size=world_size)
    if budget:
        spec.checkpointing.checkpoint_must_save_by = budget
    if must_save_by is not None:
        spec.checkpointing.must_save_by.FromNanoseconds(int(must_save_by * 1e9))
    if snapshots:
        spec.rollout_recovery.target_level = run_pb2.TARGET_LEVEL_TURN
    spec.reserve.margin_seconds = margin
    spec.reserve.expected_checkpoint_seconds = checkpoint_prior
    spec.reserve.expected_snapshot_seconds = snapshot_prior
    return spec
