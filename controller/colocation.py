"""Colocation accounting: who shares each accelerator, and how much each one asks for.

When k processes (of one or several components) share an accelerator, each requests
1/k of it. A component may fix its processes' share with ``accelerator_share``; the
processes without one then split what is left equally. Shares are rounded down to
Ray's resource granularity (1/10000), so that what placectl plans Ray can grant.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from controller.errors import ColocationError

GRANULARITY = 10_000
_EPS = 1e-9


class ShareRequest(msgspec.Struct, frozen=True):
    """One component's accelerator holdings, as input to :func:`account`."""

    component: str
    unit_node: Sequence[int]
    unit_local: Sequence[int]
    procs: Sequence[Sequence[int]]
    share: float | None = None


class AcceleratorUse(msgspec.Struct, frozen=True):
    """The processes on one accelerator and the share each requests."""

    node_rank: int
    local_index: int
    processes: list[tuple[str, int]]
    shares: list[float]

    @property
    def total(self) -> float:
        return sum(self.shares)


def _floor(x: float) -> float:
    return int(x * GRANULARITY + _EPS) / GRANULARITY


def account(requests: Sequence[ShareRequest]) -> tuple[list[list[float]], list[AcceleratorUse]]:
    """Compute every process's share and check that each accelerator's shares fit.

    Returns:
        For each request, the share each of its processes requests on its first
        accelerator; and one :class:`AcceleratorUse` per accelerator in use, ordered by
        node rank and index.

    Raises:
        ColocationError: the shares on some accelerator add up to more than 1, or leave
            nothing for the processes without an explicit share; the message names the
            accelerator and the processes.
    """
    holders: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for ci, req in enumerate(requests):
        node, local = req.unit_node, req.unit_local
        for rank, units in enumerate(req.procs):
            for u in units:
                key = (node[u], local[u])
                entry = holders.get(key)
                if entry is None:
                    holders[key] = [(ci, rank)]
                else:
                    entry.append((ci, rank))

    default_share: dict[tuple[int, int], float] = {}
    uses: list[AcceleratorUse] = []
    for key in sorted(holders):
        entry = holders[key]
        explicit = 0.0
        defaults = 0
        for ci, _ in entry:
            s = requests[ci].share
            if s is None:
                defaults += 1
            else:
                explicit += s
        left = 1.0 - explicit
        fair = _floor(left / defaults) if defaults else 0.0
        who = [(requests[ci].component, rank) for ci, rank in entry]
        shares = [requests[ci].share if requests[ci].share is not None else fair for ci, _ in entry]
        if left < -_EPS or (defaults and fair <= 0):
            listed = ", ".join(f"{c}:{r} asks {s:g}" for (c, r), s in zip(who, shares, strict=True))
            problem = (
                f"add up to {explicit:g} > 1"
                if left < -_EPS
                else "leave nothing for the processes without accelerator_share"
            )
            raise ColocationError(
                f"accelerator {key[1]} of node {key[0]} is over-subscribed: its shares "
                f"{problem} ({listed}); lower accelerator_share or place fewer processes there"
            )
        default_share[key] = fair
        uses.append(AcceleratorUse(key[0], key[1], who, shares))

    result: list[list[float]] = []
    for req in requests:
        node, local = req.unit_node, req.unit_local
        if req.share is not None:
            result.append([_floor(req.share)] * len(req.procs))
        else:
            result.append([default_share[(node[units[0]], local[units[0]])] for units in req.procs])
    return result, uses
