"""Colocation accounting: who shares each accelerator, and how much each one asks for.

The holders of an accelerator are the processes placed on it and, for an engine (a
component whose processes start their own children), one child per accelerator the
engine holds. An engine process itself holds only its first accelerator; a plain process
with several accelerators holds all of them.

When k holders share an accelerator, each requests 1/k of it. A component may fix its
processes' share with ``accelerator_share`` and its children's with ``child_share``; the
holders without one split what is left equally. A child's share is the same on every
accelerator of its engine process: the smallest fair share among them. Shares are
rounded down to Ray's resource granularity (1/10000), so what placectl plans Ray can
grant, and on every accelerator the requests of all holders sum to at most 1.
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
    children: bool = False  # an engine: one child per accelerator of each process
    child_share: float | None = None


class AcceleratorUse(msgspec.Struct, frozen=True):
    """The holders of one accelerator and the share each requests.

    ``processes[i]`` requests ``shares[i]``; ``children[j]`` (the engine process whose
    child runs here) requests ``child_shares[j]``.
    """

    node_rank: int
    local_index: int
    processes: list[tuple[str, int]]
    shares: list[float]
    children: list[tuple[str, int]] = []
    child_shares: list[float] = []

    @property
    def total(self) -> float:
        return sum(self.shares) + sum(self.child_shares)


class Shares(msgspec.Struct, frozen=True):
    """What :func:`account` decided for one request: per process, its own share and the
    share each of its children requests (0.0 when it starts none)."""

    process: list[float]
    child: list[float]


def floor_share(x: float) -> float:
    """``x`` rounded down to Ray's resource granularity."""
    return int(x * GRANULARITY + _EPS) / GRANULARITY


Holder = tuple[int, int, bool]  # (request index, process rank, is a child)


def _holders(requests: Sequence[ShareRequest]) -> dict[tuple[int, int], list[Holder]]:
    holders: dict[tuple[int, int], list[Holder]] = {}
    for ci, req in enumerate(requests):
        node, local = req.unit_node, req.unit_local
        for rank, units in enumerate(req.procs):
            own = units[:1] if req.children else units
            for u in own:
                holders.setdefault((node[u], local[u]), []).append((ci, rank, False))
            if req.children:
                for u in units:
                    holders.setdefault((node[u], local[u]), []).append((ci, rank, True))
    return holders


def account(requests: Sequence[ShareRequest]) -> tuple[list[Shares], list[AcceleratorUse]]:
    """Compute every process's and child's share and check that each accelerator fits.

    Returns:
        For each request, its :class:`Shares`; and one :class:`AcceleratorUse` per
        accelerator in use, ordered by node rank and index.

    Raises:
        ColocationError: the explicit shares on some accelerator add up to more than 1,
            or leave nothing for the holders without one; the message names the
            accelerator and every holder on it.
    """
    holders = _holders(requests)

    def explicit(ci: int, child: bool) -> float | None:
        req = requests[ci]
        return req.child_share if child else req.share

    fair: dict[tuple[int, int], float] = {}
    for key in sorted(holders):
        entry = holders[key]
        fixed = [explicit(ci, child) for ci, _, child in entry]
        taken = sum(s for s in fixed if s is not None)
        defaults = sum(1 for s in fixed if s is None)
        left = 1.0 - taken
        share = floor_share(left / defaults) if defaults else 0.0
        if left < -_EPS or (defaults and share <= 0):
            listed = ", ".join(
                f"{requests[ci].component}:{rank}{' child' if child else ''} asks "
                f"{'the rest' if s is None else f'{s:g}'}"
                for (ci, rank, child), s in zip(entry, fixed, strict=True)
            )
            problem = (
                f"add up to {taken:g} > 1"
                if left < -_EPS
                else "leave nothing for the holders without a share of their own"
            )
            raise ColocationError(
                f"accelerator {key[1]} of node {key[0]} is over-subscribed: its shares "
                f"{problem} ({listed}); lower accelerator_share/child_share or place fewer "
                "processes there"
            )
        fair[key] = share

    results: list[Shares] = []
    for req in requests:
        node, local = req.unit_node, req.unit_local
        keys = [[(node[u], local[u]) for u in units] for units in req.procs]
        if req.share is not None:
            own = [floor_share(req.share)] * len(req.procs)
        else:
            own = [fair[k[0]] for k in keys]
        if not req.children:
            child = [0.0] * len(req.procs)
        elif req.child_share is not None:
            child = [floor_share(req.child_share)] * len(req.procs)
        else:
            child = [min(fair[k] for k in ks) for ks in keys]
        results.append(Shares(own, child))

    uses: list[AcceleratorUse] = []
    for key in sorted(holders):
        procs, shares, kids, kid_shares = [], [], [], []
        for ci, rank, child in holders[key]:
            who = (requests[ci].component, rank)
            if child:
                kids.append(who)
                kid_shares.append(results[ci].child[rank])
            else:
                procs.append(who)
                shares.append(
                    results[ci].process[rank] if requests[ci].share is not None else fair[key]
                )
        uses.append(AcceleratorUse(key[0], key[1], procs, shares, kids, kid_shares))
    return results, uses
