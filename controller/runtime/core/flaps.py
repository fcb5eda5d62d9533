"""Flapping nodes held down: a node suspected again and again takes no new slot and no
spare for a while.

A link that goes down for a few seconds and comes back, over and over, makes its node a
suspect each time: its slots move off it, it answers, it is swept and free again, and
without this the next repair or held spare takes it first (it is usually the nearest
free node), so the job's ranks are moved every cycle, for as long as the link flaps. So
after ``settings.hold_down_after`` suspicions within ``settings.hold_down_window``, the
node is **held down** for ``settings.hold_down``: kept out of placement (no plan, repair
or held spare lands on it), watched as before, never fenced for it (flapping is not
death: only proof or a grace of unbroken silence fences). A node held down again within
the window of its last hold-down's end is held twice as long as the time before, up to
:data:`LONGEST` times the first, so a link that keeps flapping costs fewer moves the
longer it does; a node quiet for a window starts afresh.

Pure: imports no Ray, reads no clock (the caller passes the controller's).
"""

from __future__ import annotations

import collections

LONGEST = 32  # the longest hold-down, in multiples of the first


class Flaps:
    """The suspicions of each node in the window, and the nodes held down.

    Args:
        after: suspicions within ``window`` that hold a node down (0: never).
        window: seconds the suspicions are counted over.
        first: seconds the first hold-down of a node lasts.
    """

    def __init__(self, after: int, window: float, first: float) -> None:
        self.after, self.window, self.first = after, window, first
        self._seen: dict[str, collections.deque[float]] = {}
        self._until: dict[str, float] = {}  # node -> when its hold-down ends
        self._last: dict[str, tuple[float, float]] = {}  # node -> (length, end) of its last
        self.version = 0  # grows whenever the set of nodes held down changes

    def suspected(self, node: str, when: float) -> float:
        """``node`` was suspected at ``when``: the length of the hold-down this starts,
        or 0 when none does (too few suspicions in the window, or held down already)."""
        if not self.after:
            return 0.0
        seen = self._seen.setdefault(node, collections.deque())
        seen.append(when)
        while seen and seen[0] < when - self.window:
            seen.popleft()
        if len(seen) < self.after or self._until.get(node, float("-inf")) > when:
            return 0.0
        seen.clear()
        length, ended = self._last.get(node, (0.0, float("-inf")))
        length = min(2 * length, LONGEST * self.first) if when - ended <= self.window else 0
        length = length or self.first
        self._until[node] = when + length
        self._last[node] = (length, when + length)
        self.version += 1
        return length

    def why(self, length: float) -> str:
        """What a hold-down of ``length`` seconds is, for people."""
        return (
            f"suspected {self.after} times within {self.window:g}s: no slot or spare lands "
            f"on it for {length:g}s; watched, not fenced"
        )

    def held(self, now: float) -> dict[str, float]:
        """The nodes held down at ``now``: node -> when it ends. Those whose time is up
        are let go (the version moves)."""
        over = [n for n, until in self._until.items() if until <= now]
        for node in over:
            del self._until[node]
        if over:
            self.version += 1
        return dict(self._until)

    def drop(self, node: str) -> None:
        """``node`` is gone for good (dead or fenced): nothing of it is kept."""
        self._seen.pop(node, None)
        self._last.pop(node, None)
        if self._until.pop(node, None) is not None:
            self.version += 1


__all__ = ["LONGEST", "Flaps"]
