"""Slurm's ``--signal`` notice, seen by environment workers.

Python runs a signal handler only in the main thread, between bytecodes, and
installs one only from the main thread. The handler here does nothing but
set an event (and call a Python handler it replaced): it may interrupt the
main thread anywhere, even inside the worker's own locks. One daemon thread
per process waits on that event and calls the watchers, each on a thread of
its own: a watcher asks the coordinator, which takes up to a couple of
seconds, and several workers of one process must not wait for each other.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable

_lock = threading.Lock()  # taken by watch and unwatch only, never by the handler
_watchers: dict[int, list[Callable[[], None]]] = {}
_previous: dict[int, Any] = {}  # the handler each signal had before
_pending: dict[int, threading.Event] = {}


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def watch(signum: int, callback: Callable[[], None]) -> Callable[[], None]:
    """Calls ``callback`` (on a thread of its own) each time ``signum``
    arrives; returns what stops it. Must be called from the main thread
    (ValueError otherwise)."""
    if not in_main_thread():
        raise ValueError(f"signal handlers can only be installed from the main thread, not to watch {signal.Signals(signum).name}")
    with _lock:
        if signum not in _pending:
            _pending[signum] = threading.Event()
            threading.Thread(target=_dispatch, args=(signum, _pending[signum]), name=f"snapcoord-backstop-{signum}", daemon=True).start()
        if signal.getsignal(signum) is not _handle:
            _previous[signum] = signal.signal(signum, _handle)
        _watchers.setdefault(signum, []).append(callback)

    def unwatch() -> None:
        # The last watcher gone, the signal gets its handler back; from
        # another thread that is impossible, and the handler stays (with
        # no watchers it only calls the one it replaced).
        with _lock:
            callbacks = _watchers.get(signum, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks and in_main_thread() and signal.getsignal(signum) is _handle:
                signal.signal(signum, _previous.pop(signum))

    return unwatch


def _handle(signum: int, frame: Any) -> None:
    event = _pending.get(signum)
    if event is not None:
        event.set()
    previous = _previous.get(signum)
    if callable(previous):
        previous(signum, frame)


def _dispatch(signum: int, event: threading.Event) -> None:
    while True:
        event.wait()
        event.clear()
        with _lock:
            callbacks = list(_watchers.get(signum, []))
        for callback in callbacks:
            threading.Thread(target=callback, name="snapcoord-backstop", daemon=True).start()
