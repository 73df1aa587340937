"""A single-address client is answered again within a second of a
coordinator that was SIGKILLed and restarted serving: its retries and its
workers' calls wait on the channel, which is what makes grpcio reconnect."""

from __future__ import annotations

import datetime
import re
import threading
import time

from conftest import Coordinator, run_spec, wait_until

import snapcoord
from snapcoord import CommandKind
from snapcoord.v1 import run_service_pb2

OUTAGE = 3.0  # seconds between the SIGKILL and the restart
CYCLES = 3  # where a restart falls in a backoff varies: one cycle may be lucky


def serving_since(coordinator: Coordinator) -> float:
    """When the coordinator last logged that it serves (epoch seconds)."""
    lines = re.findall(r"^time=(\S+) level=INFO msg=serving ", coordinator.log_path.read_text(), re.M)
    return datetime.datetime.fromisoformat(lines[-1]).timestamp()


def test_calls_are_answered_within_a_second_of_serving_again(coordinator: Coordinator) -> None:
    admin = coordinator.admin()
    _, token = admin.create_run("run-a", run_spec(1, budget="00:01:00:00"))
    answered: list[float] = []  # when each call of the looping client returned
    done = threading.Event()
    call_lags: list[float] = []

    with snapcoord.connect(coordinator.addr, run_id="run-a", run_token=token, timeout=30.0, env={}) as client:

        def keep_calling() -> None:
            while not done.is_set():
                try:
                    client.get_run("run-a")
                except snapcoord.UnavailableError:
                    continue  # retries ran out: call again, as a training loop would
                answered.append(time.time())

        caller = threading.Thread(target=keep_calling, name="keep-calling")
        caller.start()
        try:
            # Its own connection, as an environment worker's process has.
            with coordinator.worker_client("run-a", token) as wclient, wclient.env_worker("env-0") as worker:
                for cycle in range(CYCLES):
                    wait_until("an answer", lambda: bool(answered))
                    coordinator.kill()
                    time.sleep(OUTAGE)  # the outage itself, not a wait for something
                    restarted = time.time()  # no answer after this comes from the old process
                    coordinator.start()  # returns once health reports SERVING
                    serving = serving_since(coordinator)
                    if cycle == CYCLES - 1:
                        # The worker, whose command stream waited through the
                        # outage, hears a deadline fired as the coordinator serves.
                        admin.call(admin.runs.TriggerDeadline, run_service_pb2.TriggerDeadlineRequest(run_id="run-a", reason="test"))
                        cmd = worker.next_command(timeout=15)
                        command_lag = time.time() - serving
                    wait_until("an answer after the restart", lambda: answered[-1] > restarted)
                    call_lags.append(next(t for t in answered if t > restarted) - serving)
        finally:
            done.set()
            caller.join(30)

    print(f"\nSERVING to the next answered call, {CYCLES} restarts: {', '.join(f'{lag:.3f}' for lag in call_lags)} s")
    print(f"SERVING to the deadline command delivered: {command_lag:.3f} s")
    assert max(call_lags) < 1.0, f"the looping client was answered {max(call_lags):.2f} s after the coordinator served again"
    assert cmd is not None and cmd.kind == CommandKind.SAVE_AT_DEADLINE
    # Looser: it also counts the coordinator's handling of TriggerDeadline and
    # the worker's registering again (its 2 s lease lapsed in the outage).
    assert command_lag < 2.0, f"the worker got its command {command_lag:.2f} s after the coordinator served again"
