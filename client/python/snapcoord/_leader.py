"""Several coordinators: a channel that sends every call to the newest leader.

The Python twin of the Go client's follow.go. gRPC's round_robin over the
coordinators whose health reports SERVING is not enough: a leader frozen by
SIGSTOP (a long GC pause, a stuck disk, a VM stall) still counts as SERVING,
its health stream frozen rather than closed, until it runs again or
keepalive drops its connection. Once another coordinator has taken over,
both look SERVING, and round_robin would send every other call to the frozen
one, where it waits out the pause. Two coordinators cannot both lead, so the
one whose health turned SERVING last is the leader.

``LeaderChannel`` keeps one channel per address, watches each one's health,
sends every call to the newest SERVING one, and cancels the calls (unary
calls, command streams, polls) still waiting on a coordinator that is no
longer the leader once they have been out ``LEADER_SETTLE`` seconds: a unary
call then fails UNAVAILABLE (``CUT_BY_NEW_LEADER`` in its details), which
the client's retry makes again at once, and a stream or poll fails, which
the worker resumes at the new leader from its last command.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Optional, Sequence

import grpc

from snapcoord import errors

# How long a call must have been out before a change of leader cuts it: a
# call waiting on a frozen leader has waited about the election TTL by then,
# while one sent a moment before the change was most likely answered already;
# a health status that flips for a moment must not cut it (as the Go client).
LEADER_SETTLE = 1.0
CUT_BY_NEW_LEADER = "another coordinator took over as leader while the call waited on the previous one (paused or cut off)"
_HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
_SERVING = 1
_WATCH_RETRY = 0.5  # between health watches of a coordinator out of reach
# How long a call made before the leader is known waits for the health
# watches to tell (a new client: connections being made).
_FIRST_LOOK = 5.0


def _health_request(service: str) -> bytes:
    # grpc.health.v1.HealthCheckRequest{service}: tag 1, length, name.
    name = service.encode()
    return b"\x0a" + bytes([len(name)]) + name


def _serving(response: bytes) -> bool:
    # HealthCheckResponse{status}: tag 1 (varint), value.
    return len(response) >= 2 and response[0] == 0x08 and response[1] == _SERVING


class CutCall(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A call the client cut, UNAVAILABLE: here, one this channel cancelled
    because another coordinator leads now (client.py cuts attempts too)."""

    def __init__(self, why: str = CUT_BY_NEW_LEADER) -> None:
        self._why = why

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._why

    def initial_metadata(self) -> Any:
        return ()

    def trailing_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> Optional[float]:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False

    def __str__(self) -> str:
        return f"UNAVAILABLE: {self._why}"


class LeaderChannel(grpc.Channel):
    """A channel over several coordinators' addresses: see the module."""

    def __init__(self, make_channel: Callable[[str], grpc.Channel], addrs: Sequence[str], service: str) -> None:
        self._channels = [make_channel(a) for a in addrs]
        self._cond = threading.Condition()
        self._turns = 0
        self._since: dict[int, int] = {}  # channel index -> its turn when it turned SERVING
        self._leader: Optional[int] = None
        self._subscribers: list[Callable[[grpc.ChannelConnectivity], None]] = []
        # The calls in flight (by id), with the leader turn they went out under.
        self._active: dict[int, tuple[Any, int]] = {}
        self._closed = threading.Event()
        self._watches: list[Any] = []
        # Each channel's connectivity, and which have answered a health
        # watch: until every one has, or failed to connect, a call waits for
        # the leader to be known, as one on a channel still connecting does.
        self._states = [grpc.ChannelConnectivity.IDLE] * len(addrs)
        self._answered: set[int] = set()
        self._state_callbacks = [functools.partial(self._state, i) for i in range(len(addrs))]
        # Not try_to_connect: the health watches connect the channels, and in
        # grpcio 1.51 a pending connect request races close() into a
        # traceback from the watching thread (see client._Retry._pause).
        for ch, cb in zip(self._channels, self._state_callbacks):
            ch.subscribe(cb, try_to_connect=False)
        self._threads = [
            threading.Thread(target=self._watch, args=(i, service), name=f"snapcoord-health-{a}", daemon=True) for i, a in enumerate(addrs)
        ]
        for t in self._threads:
            t.start()

    # Leadership, from the health watches.

    def _watch(self, i: int, service: str) -> None:
        watch = self._channels[i].unary_stream(_HEALTH_WATCH)
        while not self._closed.is_set():
            call = watch(_health_request(service), wait_for_ready=True)
            with self._cond:
                self._watches.append(call)
            if self._closed.is_set():
                call.cancel()
            try:
                for response in call:
                    self._set(i, _serving(response))
            except grpc.RpcError:
                pass
            with self._cond:
                self._watches.remove(call)
            self._set(i, False)
            self._closed.wait(_WATCH_RETRY)

    def _state(self, i: int, state: grpc.ChannelConnectivity) -> None:
        with self._cond:
            self._states[i] = state
            self._cond.notify_all()

    def _unknown(self) -> bool:
        """No leader, and some coordinator neither answered its health watch
        nor failed to connect: the leader may be among them."""
        return self._leader is None and any(
            i not in self._answered and s != grpc.ChannelConnectivity.TRANSIENT_FAILURE for i, s in enumerate(self._states)
        )

    def _set(self, i: int, serving: bool) -> None:
        with self._cond:
            self._answered.add(i)
            self._cond.notify_all()
            if serving and i not in self._since:
                self._turns += 1
                self._since[i] = self._turns
            elif not serving:
                self._since.pop(i, None)
            leader = max(self._since, key=self._since.__getitem__) if self._since else None
            if leader == self._leader:
                return
            self._leader = leader
            self._cond.notify_all()
            subscribers = list(self._subscribers)
        state = grpc.ChannelConnectivity.TRANSIENT_FAILURE if leader is None else grpc.ChannelConnectivity.READY
        for s in subscribers:
            s(state)
        if leader is not None:
            cutter = threading.Timer(LEADER_SETTLE, self._cut_stale)
            cutter.daemon = True
            cutter.start()

    def _cut_stale(self) -> None:
        """Cancels the calls still out under another leader than the current one."""
        with self._cond:
            turn = self._since.get(self._leader) if self._leader is not None else None
            if turn is None:
                return
            stale = [c for c, t in self._active.values() if t != turn]
        for c in stale:
            setattr(c, "_snapcoord_cut", True)
            c.cancel()

    def pick(self, wait_for_ready: Optional[bool], timeout: Optional[float]) -> tuple[grpc.Channel, int]:
        """The leader's channel and turn. With none known: waits for one
        within ``timeout`` if ``wait_for_ready``, else while it may still be
        found (coordinators still connecting, at most _FIRST_LOOK seconds);
        if none, a connected coordinator's channel (or the first), whose
        coordinator then answers for itself (NOT_LEADER, or unreachable),
        turn 0."""
        with self._cond:
            if wait_for_ready:
                self._cond.wait_for(lambda: self._leader is not None or self._closed.is_set(), timeout)
            elif self._unknown():
                first = _FIRST_LOOK if timeout is None else min(timeout, _FIRST_LOOK)
                self._cond.wait_for(lambda: not self._unknown() or self._closed.is_set(), first)
            if self._leader is None:
                ready = [i for i, s in enumerate(self._states) if s == grpc.ChannelConnectivity.READY]
                return self._channels[ready[0] if ready else 0], 0
            return self._channels[self._leader], self._since[self._leader]

    def refuse(self, turn: int) -> None:
        """The coordinator of ``turn`` refused a call as not the leader while
        its health still said SERVING (a deposed leader that has not yet
        said so): pass it over until it turns SERVING anew."""
        with self._cond:
            i = next((i for i, t in self._since.items() if t == turn), None)
        if i is not None:
            self._set(i, False)

    def track(self, call: Any, turn: int) -> None:
        """Keeps ``call`` until it ends, to be cut if the leader changes."""
        if not turn:
            return
        key = id(call)
        with self._cond:
            self._active[key] = (call, turn)

        def done(*_: Any) -> None:
            with self._cond:
                self._active.pop(key, None)

        if not call.add_callback(done):
            done()

    # grpc.Channel.

    def unary_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **kw: Any) -> Any:
        return _UnaryUnary(self, method, request_serializer, response_deserializer, kw)

    def unary_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **kw: Any) -> Any:
        return _UnaryStream(self, method, request_serializer, response_deserializer, kw)

    def stream_unary(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError("snapcoord has no client-streaming call")

    def stream_stream(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError("snapcoord has no bidirectional call")

    def subscribe(self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False) -> None:
        with self._cond:
            self._subscribers.append(callback)
            leader = self._leader
        callback(grpc.ChannelConnectivity.TRANSIENT_FAILURE if leader is None else grpc.ChannelConnectivity.READY)

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        with self._cond:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

    def close(self) -> None:
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
            watches = list(self._watches)
        for call in watches:
            call.cancel()
        for t in self._threads:
            t.join()
        for ch, cb in zip(self._channels, self._state_callbacks):
            ch.unsubscribe(cb)
            ch.close()

    def __enter__(self) -> "LeaderChannel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Callable:
    def __init__(self, lc: LeaderChannel, method: str, ser: Any, deser: Any, kw: dict[str, Any]) -> None:
        self._lc, self._method, self._ser, self._deser, self._kw = lc, method, ser, deser, kw

    def _target(self, channel: grpc.Channel) -> Any:
        raise NotImplementedError

    def _start(self, start: Callable[[Any, Optional[float]], Any], timeout: Optional[float], wait_for_ready: Optional[bool]) -> tuple[Any, int]:
        """Starts the call at the leader; returns it, and the leader's turn."""
        began = time.monotonic()
        channel, turn = self._lc.pick(wait_for_ready, timeout)
        if timeout is not None:
            timeout = max(0.0, timeout - (time.monotonic() - began))
        call = start(self._target(channel), timeout)
        self._lc.track(call, turn)
        return call, turn


class _UnaryUnary(_Callable):
    def _target(self, channel: grpc.Channel) -> Any:
        return channel.unary_unary(self._method, self._ser, self._deser, **self._kw)

    def future(self, request: Any, timeout: Optional[float] = None, wait_for_ready: Optional[bool] = None, **kw: Any) -> Any:
        return self._future(request, timeout, wait_for_ready, kw)[0]

    def _future(self, request: Any, timeout: Optional[float], wait_for_ready: Optional[bool], kw: dict[str, Any]) -> tuple[Any, int]:
        return self._start(lambda mc, t: mc.future(request, timeout=t, wait_for_ready=wait_for_ready, **kw), timeout, wait_for_ready)

    def with_call(self, request: Any, timeout: Optional[float] = None, wait_for_ready: Optional[bool] = None, **kw: Any) -> Any:
        future, turn = self._future(request, timeout, wait_for_ready, kw)
        try:
            return future.result(), future
        except grpc.FutureCancelledError:
            if getattr(future, "_snapcoord_cut", False):
                raise CutCall() from None
            raise
        except grpc.RpcError as err:
            if turn and errors.error_reason(err) == errors.REASON_NOT_LEADER:
                self._lc.refuse(turn)
            raise

    def __call__(self, request: Any, **kw: Any) -> Any:
        return self.with_call(request, **kw)[0]


class _UnaryStream(_Callable):
    def _target(self, channel: grpc.Channel) -> Any:
        return channel.unary_stream(self._method, self._ser, self._deser, **self._kw)

    def __call__(self, request: Any, timeout: Optional[float] = None, wait_for_ready: Optional[bool] = None, **kw: Any) -> Any:
        return self._start(lambda mc, t: mc(request, timeout=t, wait_for_ready=wait_for_ready, **kw), timeout, wait_for_ready)[0]
