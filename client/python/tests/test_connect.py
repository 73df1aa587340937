"""connect(): variables, tokens, TLS and mutual TLS against the real
coordinator; the retry interceptor against a fake call."""

from __future__ import annotations

import logging
import pathlib
import re
import socket
import subprocess
import threading
import time
from typing import Any

import grpc
import pytest
from conftest import Coordinator, free_port, run_spec

import snapcoord
from snapcoord._retry import RETRIED_METHODS, RetryPolicy
from snapcoord.nemo_rl import CoordinatorUnreachable, TimeoutChecker
from snapcoord._worker import poll_wait_seconds
from snapcoord.client import _Details, _Retry, is_loopback, parse_duration, read_token_file

ADMIN_TOKEN = "admin-token-0123456789abcdef"


def make_pki(d: pathlib.Path) -> dict[str, str]:
    """A CA, a server certificate for snapcoord.test and 127.0.0.1, a client certificate."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test-ca")
    for name, ext in (("server", "subjectAltName=DNS:snapcoord.test,IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}-key.pem", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext")  # fmt: skip
    return {n: str(d / f"{n}.pem") for n in ("ca", "server", "server-key", "client", "client-key")}


def test_mutual_tls_and_tokens_from_the_environment(snapcoord_bin: str, tmp_path: pathlib.Path) -> None:
    pki = make_pki(tmp_path)
    (tmp_path / "admin-tokens").write_text(f"# operators\n{ADMIN_TOKEN}\n")
    creds = grpc.ssl_channel_credentials(
        open(pki["ca"], "rb").read(), open(pki["client-key"], "rb").read(), open(pki["client"], "rb").read()
    )
    args = ("--tls-cert", pki["server"], "--tls-key", pki["server-key"], "--client-ca", pki["ca"],
            "--admin-token-file", str(tmp_path / "admin-tokens"))  # fmt: skip
    coord = Coordinator(snapcoord_bin, tmp_path, args, credentials=creds, server_name="snapcoord.test")
    try:
        env = {
            "SNAPCOORD_ADDR": coord.addr,
            "SNAPCOORD_CA_FILE": pki["ca"],
            "SNAPCOORD_CERT_FILE": pki["client"],
            "SNAPCOORD_KEY_FILE": pki["client-key"],
            "SNAPCOORD_SERVER_NAME": "snapcoord.test",
            "SNAPCOORD_TOKEN_FILE": str(tmp_path / "admin-tokens"),
            "SNAPCOORD_TIMEOUT": "10s",
        }
        with snapcoord.connect(env=env) as admin:
            assert admin.timeout == 10.0
            _, token = admin.create_run("tls-run", run_spec(1, budget="00:01:00:00"))
        (tmp_path / "run-token").write_text(token + "\n")
        env.update(SNAPCOORD_RUN_ID="tls-run", SNAPCOORD_RUN_TOKEN_FILE=str(tmp_path / "run-token"))
        with snapcoord.connect(env=env) as client, client.trainer(0) as trainer:
            assert trainer.complete_step(1, 0.5).action == snapcoord.Action.CONTINUE

        # A wrong admin token, and no client certificate: refused.
        with snapcoord.connect(env=env, token="wrong-admin-token-0123456789") as admin:
            with pytest.raises(snapcoord.AuthError) as err:
                admin.get_run("tls-run")
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        no_cert = snapcoord.TLS(ca_file=pki["ca"], server_name="snapcoord.test")
        with snapcoord.connect(coord.addr, tls=no_cert, token=ADMIN_TOKEN, timeout=5, retry=RetryPolicy(max_attempts=1), env={}) as c:
            with pytest.raises(snapcoord.UnavailableError):
                c.get_run("tls-run")
    finally:
        coord.stop()


def test_environment_rules(tmp_path: pathlib.Path) -> None:
    (tmp_path / "tok").write_text("\n# comment\n  run-token-abcdef0123456789  \n\n")
    assert read_token_file(str(tmp_path / "tok")) == "run-token-abcdef0123456789"
    (tmp_path / "two").write_text("a-token-0123456789abcdef\nb-token-0123456789abcdef\n")
    with pytest.raises(ValueError, match="holds 2 tokens") as err:
        read_token_file(str(tmp_path / "two"))
    assert "a-token" not in str(err.value)  # errors never quote a token
    with pytest.raises(ValueError, match="exclude each other"):
        snapcoord.connect(env={"SNAPCOORD_RUN_TOKEN": "x" * 20, "SNAPCOORD_RUN_TOKEN_FILE": str(tmp_path / "tok")})
    with pytest.raises(ValueError, match="printable ASCII"):
        snapcoord.connect(run_token="has space", env={})
    with pytest.raises(ValueError, match="plaintext excludes"):
        snapcoord.connect(env={"SNAPCOORD_PLAINTEXT": "true", "SNAPCOORD_CA_FILE": "ca.pem"})
    with pytest.raises(ValueError, match="SNAPCOORD_PLAINTEXT"):
        snapcoord.connect(env={"SNAPCOORD_PLAINTEXT": "yes"})
    # An argument beats its variable.
    c = snapcoord.connect("127.0.0.1:1", plaintext=True, run_id="mine", env={"SNAPCOORD_ADDR": "x:1", "SNAPCOORD_RUN_ID": "theirs"})
    assert c.run_id == "mine"
    c.close()
    assert parse_duration("T", "1m30s") == 90 and parse_duration("T", "500ms") == 0.5 and parse_duration("T", "2.5") == 2.5
    with pytest.raises(ValueError):
        parse_duration("SNAPCOORD_TIMEOUT", "30 seconds")
    assert [poll_wait_seconds(w) for w in (0, 0.2, 1.5, 30, 99999)] == [30, 1, 2, 30, 3600]


def test_plaintext_by_default_on_loopback_only(coordinator: Coordinator) -> None:
    """Told neither way, connect() talks plaintext to a loopback address, as
    snapctl does and where `make run`'s coordinator listens, and TLS to any
    other; TLS settings or SNAPCOORD_PLAINTEXT=false ask for TLS."""
    with snapcoord.connect(coordinator.addr, timeout=10.0, env={}) as c:
        with pytest.raises(snapcoord.NotFoundError):  # an answer: the channel works
            c.get_run("no-such-run")
    with snapcoord.connect(coordinator.addr, timeout=2.0, env={"SNAPCOORD_PLAINTEXT": "false"}) as c:
        with pytest.raises(snapcoord.UnavailableError):  # a TLS handshake with a plaintext server
            c.get_run("no-such-run")
    for addr, want in {
        "127.0.0.1:7070": True, "127.9.9.9:1": True, "[::1]:7070": True, "localhost:7070": True, "LOCALHOST:1": True,
        "0.0.0.0:7070": False, ":7070": False, "[::]:7070": False, "10.0.0.1:7070": False,
        "coordinator.example:7070": False, "127.0.0.1": False, "::1": False, "dns:///localhost:7070": False,
    }.items():  # fmt: skip
        assert is_loopback(addr) == want, addr


def test_reaches_a_coordinator_slow_to_answer_a_new_connection(coordinator: Coordinator) -> None:
    """A coordinator that takes 1.5 s to answer a new connection (a loaded
    machine, a restart replaying its log) is still reached: a connection
    attempt is not abandoned after the reconnect backoff (at most 1 s), which
    would leave the channel failing every call for as long as the slowness
    lasts."""
    with SlowStartProxy(coordinator.addr, delay=1.5) as addr, snapcoord.connect(addr, timeout=10.0, env={}) as c:
        with pytest.raises(snapcoord.NotFoundError):  # an answer: the channel connected
            c.get_run("no-such-run")


class SlowStartProxy:
    """A loopback TCP proxy that holds back each connection's first bytes
    from the server for ``delay`` seconds, then relays both ways."""

    def __init__(self, target: str, delay: float) -> None:
        host, port = target.rsplit(":", 1)
        self.target, self.delay = (host, int(port)), delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.closed = threading.Event()

    def __enter__(self) -> str:
        threading.Thread(target=self._accept, daemon=True).start()
        return "127.0.0.1:%d" % self.listener.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self.closed.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._relay, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(target=self._relay, args=(server, client, self.delay), daemon=True).start()

    def _relay(self, src: socket.socket, dst: socket.socket, delay: float) -> None:
        first = True
        try:
            while data := src.recv(65536):
                if first and self.closed.wait(delay):
                    return
                first = False
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()


class FakeCall:
    """What a unary continuation returns: here, a call that ended with ``code``."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "connection refused" if self._code == grpc.StatusCode.UNAVAILABLE else ""


def attempts(method: str, codes: list[grpc.StatusCode], policy: RetryPolicy, timeout: Any = None) -> int:
    """How many attempts the retry interceptor makes when the calls end with codes, in turn."""
    made = []

    def continuation(details: grpc.ClientCallDetails, request: Any) -> FakeCall:
        made.append(details.timeout)
        return FakeCall(codes[min(len(made), len(codes)) - 1])

    _Retry(policy).intercept_unary_unary(continuation, _Details(method, timeout, None, None, None, None), None)
    return len(made)


def test_retries_exactly_the_listed_methods_on_unavailable() -> None:
    fast = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.002)
    down = [grpc.StatusCode.UNAVAILABLE]
    for method in RETRIED_METHODS:
        assert attempts(method, down, fast) == 4, method
    assert attempts("/snapcoord.v1.RunService/ReissueRunToken", down, fast) == 1
    assert attempts("/snapcoord.v1.WorkerService/StreamCommands", down, fast) == 1
    get_run = "/snapcoord.v1.RunService/GetRun"
    assert attempts(get_run, [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK], fast) == 2
    for code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL):
        assert attempts(get_run, [code], fast) == 1
    assert attempts(get_run, down, RetryPolicy(max_attempts=1)) == 1
    # The call's timeout bounds all attempts: none starts after it.
    t0 = time.monotonic()
    n = attempts(get_run, down, RetryPolicy(max_attempts=100, base_delay=0.05, max_delay=0.05, jitter=0), timeout=0.3)
    assert 2 <= n <= 7 and time.monotonic() - t0 < 0.4


def test_a_call_with_a_timeout_outlasts_max_attempts_and_each_attempt_is_bounded() -> None:
    """A loss of etcd quorum may outlast max_attempts' backoffs: a call with
    a timeout is retried until it, and a worker's own calls (patient) until
    theirs; each attempt but a long poll's gets at most attempt_timeout."""
    get_run = "/snapcoord.v1.RunService/GetRun"
    few = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.01, jitter=0, attempt_timeout=5.0)
    down = [grpc.StatusCode.UNAVAILABLE] * 9 + [grpc.StatusCode.OK]
    assert attempts(get_run, down, few) == 2  # no timeout: max_attempts
    assert attempts(get_run, down, few, timeout=30.0) == 10
    made: list[Any] = []

    def continuation(details: grpc.ClientCallDetails, request: Any) -> FakeCall:
        made.append(details.timeout)
        return FakeCall(down[len(made) - 1])

    _Retry(few, patient=True).intercept_unary_unary(continuation, _Details(get_run, None, None, None, None, None), None)
    assert len(made) == 10 and made[0] == 5.0, made
    made.clear()
    poll = "/snapcoord.v1.WorkerService/PollCommands"
    _Retry(few).intercept_unary_unary(continuation, _Details(poll, 40.0, None, None, None, None), None)
    assert made[0] > 39, "a long poll's attempt is bounded by its own timeout only"


def test_retries_are_logged_and_a_slow_call_warns_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each retry at DEBUG (method, attempt, code, wait); a call that waited
    longer than SLOW_CALL_SECONDS (5 s; 0.25 s here) once at WARNING, with
    how long and what it waited on, whether it was answered or gave up."""
    monkeypatch.setattr(snapcoord.client, "SLOW_CALL_SECONDS", 0.25)
    caplog.set_level(logging.DEBUG, logger="snapcoord")
    policy = RetryPolicy(max_attempts=4, base_delay=0.1, max_delay=0.1, jitter=0)
    get_run = "/snapcoord.v1.RunService/GetRun"
    assert attempts(get_run, [grpc.StatusCode.UNAVAILABLE] * 3 + [grpc.StatusCode.OK], policy) == 4
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug == [f"{get_run}: attempt {n} failed (UNAVAILABLE: connection refused); retrying within 0.10s" for n in (1, 2, 3)]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and re.fullmatch(
        rf"{get_run} answered after 0\.3s and 4 attempts; it waited on: UNAVAILABLE: connection refused", warned[0]
    ), warned

    # A real channel to a closed port: given up, and the connection's error named.
    caplog.clear()
    with snapcoord.connect(f"127.0.0.1:{free_port()}", retry=policy, env={}) as client:
        with pytest.raises(snapcoord.UnavailableError):
            client.get_run("run-a")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and re.match(rf"{get_run} gave up \(UNAVAILABLE\) after 0\.\ds and 4 attempts; it waited on: UNAVAILABLE: .*127\.0\.0\.1", warned[0]), warned

    # Answered at once: nothing above DEBUG.
    caplog.clear()
    assert attempts(get_run, [grpc.StatusCode.OK], policy) == 1
    assert caplog.records == []


def test_backoff_is_jittered_exponential_and_bounded() -> None:
    p = RetryPolicy()
    for attempt, nominal in ((1, 0.1), (2, 0.2), (3, 0.4), (7, 5.0), (60, 5.0)):
        waits = [p.backoff(attempt) for _ in range(200)]
        assert all(nominal * 0.8 <= w <= nominal * 1.2 for w in waits)
        assert len(set(waits)) > 1  # jittered
    assert max(p.follow_wait(n) for n in range(1, 20)) <= 1.0


def test_self_signed_coordinator_names_the_ca_variable_to_a_client_without_it(snapcoord_bin: str, tmp_path: pathlib.Path) -> None:
    """A coordinator with --tls-self-signed DIR: a client given DIR/ca.pem
    (SNAPCOORD_CA_FILE) works; one without it, as on a node where the
    variable was not exported, is told to set SNAPCOORD_CA_FILE, not to
    start a coordinator that is running."""
    tls_dir = tmp_path / "tls"
    # The CA is made at the first start and kept: make it, then serve with it.
    first = subprocess.Popen([snapcoord_bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d0"),
                              "--metrics-listen", "", "--tls-self-signed", str(tls_dir)], stderr=subprocess.PIPE)  # fmt: skip
    assert first.stderr is not None
    for line in first.stderr:
        if b"msg=serving" in line:
            break
    first.terminate()
    first.wait()
    ca = (tls_dir / "ca.pem").read_bytes()
    coord = Coordinator(snapcoord_bin, tmp_path, ("--tls-self-signed", str(tls_dir)),
                        credentials=grpc.ssl_channel_credentials(ca), server_name="127.0.0.1")  # fmt: skip
    try:
        env = {"SNAPCOORD_ADDR": coord.addr, "SNAPCOORD_CA_FILE": str(tls_dir / "ca.pem"), "SNAPCOORD_TIMEOUT": "10s"}
        with snapcoord.connect(env=env) as admin:
            _, token = admin.create_run("job-run", run_spec(1, budget="00:01:00:00"))
        # TLS, as to another node's address (told neither way, a client
        # speaks plaintext to loopback).
        without = {"SNAPCOORD_ADDR": coord.addr, "SNAPCOORD_PLAINTEXT": "false", "SNAPCOORD_RUN_ID": "job-run", "SNAPCOORD_RUN_TOKEN": token}
        with snapcoord.connect(env=without, timeout=5, retry=RetryPolicy(max_attempts=1)) as c:
            with pytest.raises(snapcoord.UnavailableError) as err:
                c.get_run("job-run")
        assert "set SNAPCOORD_CA_FILE" in str(err.value)
        with pytest.raises(CoordinatorUnreachable) as unreachable:
            TimeoutChecker(timeout=None, env=without)
        assert "over TLS" in str(unreachable.value) and "set SNAPCOORD_CA_FILE" in str(unreachable.value)
        assert "start it" not in str(unreachable.value)
    finally:
        coord.stop()
