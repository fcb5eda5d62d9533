"""The controller's core: what every step works on (the records' owner and its stewards,
the table, the nodes, the settings, the context that hands them out), and, here, every
task the controller runs beside its calls, in one registry (what ``stop()`` ends), and the
one clock they read.

Operations start their background work here (the loop, a repair, a preemption, an orphan
sweep, the raylet watch, a fence) and register the calls another call may have to cancel
(a reserve in progress, which a release or a cancel stops). A task is named by its kind
and a key, and one runs per name at a time, so "is the repair of ``j`` running?" and
"start it unless it runs" are one lookup here instead of a set kept beside each task.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

Name = tuple[str, str]  # (kind, key)


def now() -> float:
    """The controller's monotonic clock: its event loop's ``time()``.

    Every deadline, period and backoff of the controller reads this (or waits with
    ``asyncio.sleep``, which reads the same clock), so the event loop is the clock to
    inject: in production it is the monotonic clock, and a test that runs the controller
    on ``clients.testing.virtual_time`` skips its idle waits. Outside a running loop
    (a thread's work), the monotonic clock."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def wall() -> float:
    """Seconds since the epoch, as the loop's clock moves them: for deadlines kept in
    records (a drain's, a preemption's grace), which must read as real times across
    restarts, and must pass with the loop's clock in a virtual-time test."""
    return time.time() + (now() - time.monotonic())


async def to_the_end(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to its end even if the caller is cancelled meanwhile, once or many
    times; the cancellation is raised after it ends. A rollback in a job's step must end
    before the step does: the next step of the job would otherwise
    find its write still under way (``asyncio.shield`` alone returns at the first
    cancellation and leaves the work running unowned)."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():  # the work itself was cancelled (stop()): nothing to wait for
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


class Tasks:
    """The controller's tasks by name (see the module docstring)."""

    def __init__(self) -> None:
        self._named: dict[Name, asyncio.Task] = {}

    def start(self, kind: str, key: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run ``coro`` as the task ``(kind, key)``; the one already running under that
        name instead, if any (``coro`` is then closed without running)."""
        running = self.get(kind, key)
        if running is not None:
            coro.close()
            return running
        task = asyncio.get_running_loop().create_task(coro, name=f"placectl:{kind}:{key}")
        self._track((kind, key), task)
        return task

    def adopt(self, kind: str, key: str) -> None:
        """Register the current task (a call in progress) as ``(kind, key)``, until
        :meth:`drop`; another call can then cancel it, and ``stop()`` does."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Tasks.adopt is for a coroutine running as a task")
        self._named[(kind, key)] = task

    def drop(self, kind: str, key: str) -> None:
        """The current task is no longer ``(kind, key)``."""
        if self._named.get((kind, key)) is asyncio.current_task():
            del self._named[(kind, key)]

    def get(self, kind: str, key: str) -> asyncio.Task | None:
        """The task running as ``(kind, key)``, if one is."""
        task = self._named.get((kind, key))
        return task if task is not None and not task.done() else None

    def keys(self, kind: str) -> set[str]:
        """The keys of the running tasks of ``kind``."""
        return {k for (c, k), t in self._named.items() if c == kind and not t.done()}

    def stop(self) -> None:
        """Cancel every task, the calls registered here included."""
        for task in list(self._named.values()):
            task.cancel()

    def _track(self, name: Name, task: asyncio.Task) -> None:
        self._named[name] = task

        def forget(done: asyncio.Task) -> None:
            if self._named.get(name) is done:
                del self._named[name]

        task.add_done_callback(forget)
