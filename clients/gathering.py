"""A driver waiting on a group's calls: until each rank answers, or until the
controller's verdict says a rank is lost.

A call into a rank on a hung or cut-off host never returns while Ray calls the host
alive (about a minute with Ray's defaults, for ever for a rank stopped on a live node
until ``repair()`` judges it). :func:`gather` waits for the calls as ``ray.get`` would,
and once they have taken :data:`QUIET_S` it watches the ranks still pending (on a thread
of its own, so an answer is never held up by a look): when the controller's verdict
ends one (its node suspected, moved off, dead or fenced, or its slot moved:
:mod:`clients.members`), the wait ends with :class:`RanksLost`, which names the lost
ranks and carries the answers of the others. A slow rank is never given up for time
alone: only a verdict or a move ends the wait.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray

from controller.errors import PlacementError

# Calls that answer within this long are never watched: most do, and a look costs a
# call to the controller.
QUIET_S = 1.0
SLICE_S = 0.05  # how often the wait checks the watcher's word between answers
# How often the watcher looks. Its looks never wait on the controller (a long-poll): a
# call in flight when the wait ends would outlive it, and a driver that goes on to
# ray.shutdown() and connects anew (a head restart) then failed to start its node.
LOOK_EVERY_S = 0.2


class RanksLost(PlacementError):
    """Ranks a call was waiting on are lost by the controller's verdict: the call gave
    up on them at the verdict, not at Ray's. ``repair()`` relaunches them.

    Attributes:
        ranks: each lost rank, and why.
        results: the answers of the ranks that answered, by rank (an exception a rank
            raised is its answer here).
    """

    def __init__(
        self,
        message: str,
        ranks: Mapping[int, str] | None = None,
        results: Mapping[int, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.ranks = dict(ranks or {})
        self.results = dict(results or {})

    def __reduce__(self):  # crosses Ray with its fields
        return (type(self), (str(self), self.ranks, self.results))


def gather(
    refs: Mapping[int, ray.ObjectRef],
    members: Sequence[str],
    look: Callable[[Sequence[str], int], Mapping[int, str]],
    label: str,
    timeout: float | None = None,
) -> tuple[dict[int, Any], list[int]]:
    """Wait for each rank's call (``refs``: rank -> ObjectRef), at most ``timeout``
    seconds (None: as long as they take). ``members``: each rank's node as the group
    started it; ``look(members, own)``: the lost ranks and why
    (:class:`clients.members.ControllerLook`). Returns the answers of the ranks that
    answered and the ranks still pending at ``timeout``; a rank's error is raised as
    ``ray.get`` raises it.

    Raises:
        RanksLost: a pending rank is lost by the controller's verdict.
    """
    pending = dict(refs)
    results: dict[int, Any] = {}
    deadline = None if timeout is None else _now() + timeout

    def take(wait: float) -> None:
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=wait)
        done = set(ready)
        for r in [r for r, ref in pending.items() if ref in done]:
            results[r] = ray.get(pending.pop(r))

    take(_left(deadline, QUIET_S))
    if not pending or (deadline is not None and _now() >= deadline):
        return results, sorted(pending)
    watcher = _Watcher(members, look)
    try:
        while pending and (deadline is None or _now() < deadline):
            if lost := {r: why for r, why in watcher.lost().items() if r in pending}:
                _answered(pending, results)
                said = "; ".join(f"rank {r}: {why}" for r, why in sorted(lost.items()))
                raise RanksLost(
                    f"{label}: the call gave up on ranks {sorted(lost)} at the controller's "
                    f"verdict ({said}); repair() relaunches them",
                    lost,
                    results,
                )
            take(_left(deadline, SLICE_S))
    finally:
        watcher.stop()
    return results, sorted(pending)


def _answered(pending: dict[int, ray.ObjectRef], results: dict[int, Any]) -> None:
    """Take every answer already in, an error as the rank's answer."""
    ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=0)
    done = set(ready)
    for r in [r for r, ref in pending.items() if ref in done]:
        try:
            results[r] = ray.get(pending.pop(r))
        except Exception as e:  # the rank's own failure is its answer
            results[r] = e


def _now() -> float:
    return time.monotonic()


def _left(deadline: float | None, most: float) -> float:
    return most if deadline is None else max(0.0, min(most, deadline - _now()))


class _Watcher:
    """Looks at the controller's verdicts on a thread of its own while a wait lasts."""

    def __init__(
        self, members: Sequence[str], look: Callable[[Sequence[str], int], Mapping[int, str]]
    ) -> None:
        self._members, self._look = list(members), look
        self._lost: dict[int, str] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="placectl-gather", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            # The controller away for a moment: no word, no end.
            with contextlib.suppress(Exception):
                self._lost = dict(self._look(self._members, -1))
            self._stopped.wait(LOOK_EVERY_S)

    def lost(self) -> dict[int, str]:
        return dict(self._lost)

    def stop(self) -> None:
        """End the looks, and wait for the one in flight: no call of the watcher's
        outlives the wait it served."""
        self._stopped.set()
        self._thread.join(timeout=30)


__all__ = ["QUIET_S", "RanksLost", "gather"]
