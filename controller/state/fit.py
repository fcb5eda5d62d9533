"""Whether a reservation can ever fit the nodes it is planned on.

Ray keeps a placement group that can never be placed pending forever, and a reserve that
waits for it waits its whole timeout for nothing. Each slot is pinned to one node, so a
slot that asks for more than its node has *in total* can never be placed, whatever other
jobs release and whether or not the cluster autoscales (a new node does not grow an old
one). Compared with totals, not with what is free: what others hold is a wait, not a
refusal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.state.records import SlotRecord

EPSILON = 1e-9  # Ray keeps resources in units of 1/10000


def shortfalls(
    slots: Iterable[SlotRecord],
    totals: Mapping[str, Mapping[str, float]],
    kept: Iterable[SlotRecord] = (),
) -> list[str]:
    """One line per slot that asks its node for more than the node has in total (less
    what the same reservation's ``kept`` slots hold there, for an apply).

    Args:
        slots: the planned slots (node id, rank and IP, bundles).
        totals: every alive node's total resources, by node id; a node missing here is
            skipped (dead or unknown: the wait for it says so).
        kept: slots of the same reservation that stay on their nodes.
    """
    held: dict[str, dict[str, float]] = {}
    for slot in kept:
        mine = held.setdefault(slot.node_id, {})
        for k, v in slot.need().items():
            mine[k] = mine.get(k, 0.0) + v
    asked: dict[str, dict[str, float]] = {}
    out = []
    for slot in slots:
        total = totals.get(slot.node_id)
        if total is None:
            continue
        need = asked.setdefault(slot.node_id, dict(held.get(slot.node_id, {})))
        for k, v in slot.need().items():
            need[k] = need.get(k, 0.0) + v
        short = sorted(k for k, v in need.items() if v > total.get(k, 0.0) + EPSILON)
        if short:
            asks = ", ".join(f"{k} {need[k]:g}" for k in short)
            has = ", ".join(f"{k} {total.get(k, 0.0):g}" for k in short)
            out.append(
                f"node {slot.node_rank} ({slot.node_ip}) would need {asks}; it has {has} in total"
            )
    return out


def holders(jobs: Iterable[str], limit: int = 4) -> str:
    """``" (held by a, b)"`` for a progress line, or ``""``."""
    names = sorted(jobs)
    if not names:
        return ""
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f" (held by {', '.join(names[:limit])}{more})"
