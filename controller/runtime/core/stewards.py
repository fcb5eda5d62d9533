"""One steward per reservation: a job's record changes only in a step its steward runs.

Every change of a job's record is a *step*: a function posted to the job's steward with
the :class:`Trigger` that asked for it (a reserve, a release, an apply, a repair, a move, a
port lease, a preemption's deadline, a check's verdict, clearing an apply cut short). The
steward runs its job's steps one at a time, in the order they were posted; the steps of
different jobs run at once. Who posts a step waits for its result, or its error, as from
a call. A step posted to an idle steward runs at once in its poster's task (no hop
through another task: the poster goes on the moment its step ends); a step posted while
another runs waits in the mailbox, and the steward runs it in a task of its own.

Guarantees:

* Two steps of one job never overlap, and run in the order they were posted.
* A poster that is cancelled cancels its step: a waiting step never runs; a running one
  is cancelled, and the steward waits for it to end (its rollback) before the next.
* A step that fails fails its poster, never the steward or another step.
* A step runs with its poster's context (whose token acted goes with it into the events).
* ``busy(job)``: a step of the job runs or waits. A check posts no step then: whoever runs
  is changing the record anyway, and the job is checked again at the next tick.
* A steward with nothing to do ends; :meth:`Stewards.stop` (the controller's) cancels
  every step, running or waiting, and refuses new ones.
* Reads post no step: records are frozen and replaced whole.

Beneath the stewards, the state owner refuses a commit built from a record that is no
longer current (:class:`~controller.errors.StaleChange`), so a writer outside a step
fails loudly instead of erasing another's change.

Nothing spans jobs: the steps of different jobs run at once. Where they compete for the
same free room (a repair, a move or a hold choosing a node), each claims what it chose
before it awaits anything (:mod:`controller.runtime.core.claims`).

What each change of a record is: :mod:`controller.runtime.core.transitions`.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from controller.runtime.core import Tasks

T = TypeVar("T")


class Trigger(enum.Enum):
    """What asked for a step."""

    RESERVE = "reserve"  # a driver's reserve (placed now, or queued and placed in turn)
    PLACE_ADMITTED = "place admitted"  # the queue admitted it with no caller waiting
    CANCEL = "cancel"  # wait out the rollback of a reserve cancelled before it
    RELEASE = "release"
    FINISH_RELEASE = "finish release"  # a release cut short (a restart), taken up again
    APPLY = "apply"  # a new configuration, or one component resized
    LEASE = "lease"  # ports leased to a rank
    RETURN_PORTS = "return ports"
    PREEMPT = "preempt"  # a preemptible reservation given its deadline
    CHECK = "check"  # the verdict of what Ray reports: ready or degraded
    CLEAR_INTENT = "clear intent"  # an apply that could not clear its intent
    REPAIR = "repair"  # lost slots replaced
    MOVE = "move"  # slots on draining nodes moved, make before break
    DROP_LEAVING = "drop leaving"  # groups left on draining nodes removed at their time
    HOLD = "hold"  # held spares taken or dropped (cluster.spares)


@dataclass(eq=False)
class _Step:
    trigger: Trigger
    run: Callable[[], Awaitable[Any]]
    context: contextvars.Context
    done: asyncio.Future
    task: asyncio.Task | None = None

    def cancel(self) -> None:
        """Its poster went: it never runs, or it is cancelled where it runs."""
        if self.task is not None:
            self.task.cancel()
        elif not self.done.done():
            self.done.cancel()


class Steward:
    """The steward of one job: its mailbox of steps, and the one it runs."""

    def __init__(self, job: str, gone: Callable[[Steward], None]) -> None:
        self.job = job
        self.running: _Step | None = None
        self._mailbox: collections.deque[_Step] = collections.deque()
        self._gone = gone

    def post(self, step: _Step) -> None:
        self._mailbox.append(step)

    def busy(self) -> bool:
        return self.running is not None or any(not s.done.done() for s in self._mailbox)

    def doing(self) -> list[str]:
        """The trigger of the step it runs, then those of the steps that wait."""
        now = [self.running] if self.running is not None else []
        return [s.trigger.value for s in [*now, *self._mailbox] if not s.done.done()]

    async def run_here(self, step: _Step, then: Callable[[Steward], None]) -> Any:
        """Run ``step`` in the current task (the steward was idle); then serve what was
        posted meanwhile (``then``), or end."""
        self.running = step
        try:
            return await step.run()
        finally:
            self.running = None
            if not step.done.done():
                step.done.set_result(None)
            if self._mailbox:
                then(self)
            else:
                self._gone(self)

    def stop(self) -> None:
        """Cancel the step that runs and every one that waits."""
        for step in [self.running, *self._mailbox]:
            if step is not None:
                step.cancel()
                if not step.done.done():
                    step.done.cancel()
        self._mailbox.clear()

    async def serve(self) -> None:
        """Run the steps, one at a time, until none is left; then end."""
        try:
            while self._mailbox:
                step = self._mailbox.popleft()
                if step.done.done():  # its poster went before it ran
                    continue
                self.running = step
                step.task = asyncio.get_running_loop().create_task(
                    step.run(),
                    name=f"placectl:{step.trigger.value}:{self.job}",
                    context=step.context,
                )
                step.task.add_done_callback(_retrieved)
                await asyncio.wait([step.task])
                self.running = None
                _settle(step)
        finally:  # stopped (or ended): nobody is left waiting on a step that will not run
            self.stop()
            self.running = None
            self._gone(self)


def _retrieved(task: asyncio.Task) -> None:
    """Read a step's error even when its poster went (no "never retrieved" noise)."""
    if not task.cancelled():
        task.exception()


def _settle(step: _Step) -> None:
    """Hand the step's outcome to its poster (who may have gone)."""
    task, done = step.task, step.done
    if task is None:
        return
    if task.cancelled():
        done.cancel()
        return
    error = task.exception()
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())


class Stewards:
    """Every job's steward, made when a step is first posted (see the module docstring)."""

    def __init__(self, tasks: Tasks) -> None:
        self._tasks = tasks
        self._by_job: dict[str, Steward] = {}
        self._stopped = False

    async def run(self, job: str, trigger: Trigger, step: Callable[[], Awaitable[T]]) -> T:
        """Post ``step`` to ``job``'s steward and wait for its result (or its error)."""
        if self._stopped:
            raise asyncio.CancelledError(f"the controller stopped: no {trigger.value} of {job!r}")
        loop = asyncio.get_running_loop()
        posted = _Step(trigger, step, contextvars.copy_context(), loop.create_future())
        steward = self._by_job.get(job)
        if steward is None:  # idle: the step runs here and now
            steward = self._by_job[job] = Steward(job, self._forget)
            posted.task = asyncio.current_task()
            return await steward.run_here(posted, self._serve)
        steward.post(posted)
        try:
            return await asyncio.shield(posted.done)
        except asyncio.CancelledError:
            posted.cancel()  # this poster went; a step cancelled in place is already done
            raise

    def stop(self) -> None:
        """The controller stops: every step is cancelled, and none is taken any more."""
        self._stopped = True
        for steward in list(self._by_job.values()):
            steward.stop()

    async def settled(self, job: str, trigger: Trigger) -> None:
        """Wait until every step of ``job`` posted before this one has ended."""

        async def nothing() -> None:
            return None

        await self.run(job, trigger, nothing)

    def busy(self, job: str) -> bool:
        """Whether a step of ``job`` runs or waits."""
        steward = self._by_job.get(job)
        return steward is not None and steward.busy()

    def doing(self) -> dict[str, list[str]]:
        """Job -> what its steward runs, then what waits (busy stewards only)."""
        return {job: s.doing() for job, s in self._by_job.items() if s.busy()}

    def _serve(self, steward: Steward) -> None:
        if self._stopped:
            steward.stop()
            self._forget(steward)
        else:
            self._tasks.start("steward", steward.job, steward.serve())

    def _forget(self, steward: Steward) -> None:
        if self._by_job.get(steward.job) is steward:
            del self._by_job[steward.job]


__all__ = ["Steward", "Stewards", "Trigger"]
