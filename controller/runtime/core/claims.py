"""Claims: the room on a node that a step chose for a group it is about to make.

A repair, a move and a hold each choose nodes from Ray's free resources, then create
groups there, which Ray places a moment later (up to ``settings.repair_timeout``). Two
jobs choosing from the same read would both take the same free node, and the loser's
group would never place. Instead of one lock across every job held for a whole repair
(each job's repair then waited behind the others' group creations and probes), each
chooser **claims** the room it chose before it awaits anything: choosing and claiming
are one step of the event loop, so no other chooser runs in between, and every later
choice sees the claim, subtracted from Ray's free resources (:meth:`Claims.free`). A
claim is let go when its step ends: its group is placed (Ray counts it as used from
then on) and recorded, or it was removed.

Pure bookkeeping: no Ray, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping


class Claims:
    """Every claim, by who made it (a step of one job: ``repair/j``, ``hold/j``)."""

    def __init__(self) -> None:
        self._by: dict[str, dict[str, dict[str, float]]] = {}  # who -> node -> resources
        self.made = 0  # claims ever made (tests, benchmarks)

    def free(
        self, free: Mapping[str, Mapping[str, float]], but: str = ""
    ) -> dict[str, dict[str, float]]:
        """Ray's free resources per node (``free``) less every claim but ``but``'s."""
        out = {node: dict(have) for node, have in free.items()}
        for who, nodes in self._by.items():
            if who == but:
                continue
            for node, claimed in nodes.items():
                have = out.get(node)
                if have is None:
                    continue
                for k, v in claimed.items():
                    have[k] = have.get(k, 0.0) - v
        return out

    def claim(self, who: str, node: str, need: Mapping[str, float]) -> None:
        """``who`` takes ``need`` on ``node`` (added to what it claimed there)."""
        mine = self._by.setdefault(who, {}).setdefault(node, {})
        for k, v in need.items():
            mine[k] = mine.get(k, 0.0) + v
        self.made += 1

    def busy(self, but: str = "") -> dict[str, int]:
        """Node -> how many claims of others than ``but`` are on it (groups being made
        there now): a chooser prefers a node with fewer, among equally good ones."""
        out: dict[str, int] = {}
        for who, nodes in self._by.items():
            if who != but:
                for node in nodes:
                    out[node] = out.get(node, 0) + 1
        return out

    def release(self, who: str) -> None:
        """Every claim of ``who`` ends."""
        self._by.pop(who, None)

    def claimed(self) -> dict[str, dict[str, dict[str, float]]]:
        """Who claims what where, now (``health()``)."""
        return {who: {n: dict(r) for n, r in nodes.items()} for who, nodes in self._by.items()}


__all__ = ["Claims"]
