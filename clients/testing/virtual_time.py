"""An asyncio event loop whose clock skips idle waits: the controller tested without waiting.

The controller reads time only through its event loop (``controller.runtime.core.now``
and ``wall``, ``asyncio.sleep``, ``asyncio.wait_for``), so the loop is its clock: run it
on :class:`VirtualTimeLoop` and a health check's seconds of silence, a drain's deadline
or a repair's backoff pass as soon as nothing else is left to run. The loop's clock is
the monotonic clock plus every wait it skipped, so work still takes the time it takes,
and timers still fire in the order of their deadlines: only the idle gaps go.

What cannot be skipped is work in another thread: while a call handed to
``run_in_executor`` (``asyncio.to_thread``) is out, the loop waits in real time. Threads
started by other means (a gRPC server, Ray) are not seen: tests of those keep a real
loop.

Use :func:`run` in place of ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_REAL_SLICE_S = 0.01  # how long the loop waits in real time while a thread's work is out


class _Selector:
    """The loop's selector, but a wait with nothing to wait for moves the clock instead."""

    def __init__(self, real: selectors.BaseSelector, loop: VirtualTimeLoop) -> None:
        self._real, self._loop = real, loop

    def select(self, timeout: float | None = None):
        if timeout is not None and timeout <= 0:
            return self._real.select(0)
        events = self._real.select(0)
        if events:
            return events
        if self._loop._threads or timeout is None:
            # A thread's answer (or, with no timer at all, only one) can wake the loop:
            # wait for it in real time, and let the clock move as the real one did.
            wait = _REAL_SLICE_S if timeout is None else min(timeout, _REAL_SLICE_S)
            return self._real.select(wait)
        self._loop._skip(timeout)  # nothing can happen before the next timer: skip to it
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector loop whose ``time()`` is the monotonic clock plus every idle wait it
    skipped: work takes the time it takes, waiting takes none (see the module
    docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._skipped = 0.0
        self._threads = 0
        self._selector = _Selector(self._selector, self)

    def time(self) -> float:
        return time.monotonic() + self._skipped

    def _skip(self, seconds: float) -> None:
        self._skipped += max(seconds, 0.0)

    def run_in_executor(self, executor, func, *args) -> asyncio.Future:
        future = super().run_in_executor(executor, func, *args)
        self._threads += 1

        def done(_: asyncio.Future) -> None:
            self._threads -= 1

        future.add_done_callback(done)
        return future


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on a :class:`VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)
