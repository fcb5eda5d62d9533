"""Who may change a job when: the controller's serialisation rules, in one place.

* Every change of a job's record is made holding that job's lock: reserve, release,
  apply (and resize), repair, port leases, a preemption's deadline, a check's verdict
  (ready or degraded), and clearing the intent of an apply cut short. Operations on one
  job run one at a time, in the order they asked; operations on different jobs at once.
* The state owner enforces it: a commit names the record it was built from and is
  refused (:class:`~controller.errors.StaleChange`, nothing written) when that record
  is no longer current or another write of the job is under way. A writer that skipped
  the lock fails loudly instead of silently erasing another's change.
* A repair also holds the cluster-wide repair lock, taken *before* the job's lock, so
  each repair chooses its spares knowing what the previous one took. Nothing else takes
  it: a repair waits only behind other repairs and its own job.
* A check (the loop's, or a call confirming a reservation against Ray) never waits: it
  takes the job's lock only when it is free; a job whose lock is held is checked again
  at the next tick, since whoever holds it is changing the record anyway.
* A preemption waits for the job's lock in a task of its own, never in the admission
  pass, so a long apply of the preempted job does not stall the queue.
* Reads take no lock: records are frozen and replaced whole.
* A release or cancel of a job whose reserve is in progress cancels the reserve's task,
  then takes the job's lock, which it gets once the reserve has rolled back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class JobLocks:
    """The per-job locks and the repair lock (see the module docstring for the rules)."""

    def __init__(self) -> None:
        self._jobs: dict[str, asyncio.Lock] = {}
        self._repairs = asyncio.Lock()

    def job(self, job: str) -> asyncio.Lock:
        """The lock held by whatever changes ``job``'s record."""
        lock = self._jobs.get(job)
        if lock is None:
            lock = self._jobs[job] = asyncio.Lock()
        return lock

    def busy(self, job: str) -> bool:
        """Whether an operation is changing ``job`` now (a check then skips it)."""
        lock = self._jobs.get(job)
        return lock is not None and lock.locked()

    @contextlib.asynccontextmanager
    async def repairing(self, job: str) -> AsyncIterator[None]:
        """The repair lock, then ``job``'s: held while a repair changes ``job``."""
        async with self._repairs, self.job(job):
            yield
