"""A worker group following its reservation to a new epoch: ``sync()`` after an ``apply``
(or a repair), and make before break ahead of a drain (``prepare()`` starts the moved
ranks' replacements beside the running ones, the next ``sync()`` swaps them in).
``WorkerGroup`` has these as its own methods."""

from __future__ import annotations

from typing import Any

import msgspec

from clients.launching import wait_until_ready
from clients.sync import SyncResult, plan_sync


class Moves:
    """``sync`` and ``prepare`` of a ``WorkerGroup`` (its ``reservation``,
    ``component``, ``_roster`` and ``_short``: :mod:`clients.workers`)."""

    reservation: Any
    component: str

    def sync(self, restart: bool = False, timeout: float = 300.0) -> SyncResult:
        """Bring the running workers to the reservation's current epoch, after an
        ``apply`` (or a repair): ranks that stopped or moved are killed, ranks that are
        new or moved are started in their bundles, unchanged ranks keep running.

        Args:
            restart: when the component needs a new process group (its world size
                changed, or its rank 0 moved), restart every rank instead of only the
                ones that changed.
            timeout: for the reservation to be ready and the new workers to start.

        Returns:
            What was kept, moved, started and stopped, and why the component needs a
            new process group if it does (``restart_needed``).

        Raises:
            PlacementError: ranks must start but the group was attached, not launched
                here (its constructor arguments are unknown).
        """
        res = self.reservation
        res.wait_ready(timeout)
        fresh = res.assignments(self.component) if self.component in res.components else []
        result = plan_sync(self.component, res.epoch, self._roster.assignments, fresh)
        dead = set(self.dead_ranks()) & set(result.kept)
        if dead:  # kept in place, but its worker is gone: started again in its bundle
            result = msgspec.structs.replace(
                result,
                kept=[r for r in result.kept if r not in dead],
                moved=sorted({*result.moved, *dead}),
            )
        if restart and result.restart_needed:
            every = list(range(len(fresh)))
            result = msgspec.structs.replace(
                result,
                kept=[],
                moved=every[: len(result.kept) + len(result.moved)],
                restarted=True,
            )
        starting = sorted(result.moved + result.started)
        if starting:
            self._roster.require_launch("sync() must start ranks and")
        with self._short.lock:  # a lost rank started here runs whole again
            self._roster.shrink(len(fresh))
            self._roster.relaunch(starting, fresh)
            self._short.settled([*starting, *(r for r in self._short.lost if r >= len(fresh))])
        if starting:
            label = f"{res.job}/{self.component}"
            wait_until_ready([self._roster.actors[r] for r in starting], label, timeout)
        return result

    def prepare(self) -> list[int]:
        """Start now, beside the running workers, the replacements of the ranks whose
        bundle the reservation's current epoch moved, without waiting for them: make
        before break for a drain, whose old bundles stay until the node's deadline. The
        next :meth:`sync` swaps them in (a kill, not a start). Call it again at each step
        boundary: replacements of an assignment that changed meanwhile are dropped.

        Returns:
            The ranks with a replacement started (empty when nothing moved).
        """
        res = self.reservation
        if self.component not in res.components or res.refresh().state != "ready":
            return []
        fresh = res.assignments(self.component)
        moved = plan_sync(self.component, res.epoch, self._roster.assignments, fresh).moved
        if moved:
            self._roster.require_launch("prepare()")
        with self._short.lock:  # beside a background start of a group running short
            return self._roster.prepare(moved, fresh)

    def prepared_ready(self) -> bool:
        """Whether every replacement :meth:`prepare` started has finished starting."""
        return self._roster.prepared_ready()
