"""Placement groups that wait outside every reservation.

An engine or a job started without placectl asks Ray for accelerators of its own: vLLM's
Ray executor, outside a placement group, makes one of ``tensor_parallel_size`` GPU
bundles and waits for it (it logs at 10, 30, 70 s... and gives up after 30 minutes).
While reservations hold the accelerators, Ray keeps such a group pending and tells
nobody else. ``placectl status`` names each one, so that whoever looks at the cluster
sees what waits and why (see :func:`waiting`).
"""

from __future__ import annotations

from typing import Any

import msgspec

# The prefixes of placectl's own groups: a reservation's slots and its demand groups.
OWN_PREFIXES = ("placectl:", "placectl-demand:")
WAITING_STATES = ("PENDING", "RESCHEDULING")


class Waiting(msgspec.Struct, frozen=True):
    """A placement group that is not placectl's and is not placed."""

    group_id: str
    name: str
    state: str  # Ray's: PENDING or RESCHEDULING
    why: str  # Ray's scheduling state: NO_RESOURCES, INFEASIBLE, QUEUED, ...
    attempts: int
    resources: dict[str, float]  # its bundles' resources, summed


def waiting(table: dict[str, dict[str, Any]]) -> list[Waiting]:
    """The groups of Ray's group table (``placement_group_table()``) that wait outside
    every reservation, in id order."""
    out = []
    for gid, entry in sorted(table.items()):
        name = entry.get("name") or ""
        if entry.get("state") not in WAITING_STATES or name.startswith(OWN_PREFIXES):
            continue
        total: dict[str, float] = {}
        for bundle in (entry.get("bundles") or {}).values():
            for key, amount in bundle.items():
                total[key] = total.get(key, 0.0) + float(amount)
        stats = entry.get("stats") or {}
        out.append(
            Waiting(
                group_id=gid,
                name=name,
                state=entry["state"],
                why=str(stats.get("scheduling_state", "")),
                attempts=int(stats.get("scheduling_attempt", 0)),
                resources=total,
            )
        )
    return out


def describe(group: Waiting, held: dict[str, tuple[float, float]]) -> str:
    """One line: the group, what it asks for, Ray's reason, and for each accelerator it
    asks for how much of the cluster's the reservations hold (``held``: resource ->
    (held by reservations, the cluster's total))."""
    label = f"{group.name!r} ({group.group_id[:8]})" if group.name else group.group_id[:8]
    asks = ", ".join(f"{v:g} {k}" for k, v in sorted(group.resources.items()))
    line = (
        f"placement group {label} waits outside any reservation for {asks or 'nothing'} "
        f"(Ray: {group.state}, {group.why or 'no reason given'}, "
        f"{group.attempts} attempt(s))"
    )
    holds = [
        f"reservations hold {h:g} of {t:g} {k}"
        for k, (h, t) in sorted(held.items())
        if k in group.resources
    ]
    return line + (": " + "; ".join(holds) if holds else "")


def read(ctl: Any) -> tuple[list[Waiting], dict[str, tuple[float, float]]]:
    """From Ray: the waiting groups, and what placectl's reservations hold of each
    accelerator against the cluster's total."""
    import ray
    from ray.util.placement_group import placement_group_table

    groups = waiting(placement_group_table())
    if not groups:
        return [], {}
    total = ray.cluster_resources()
    held: dict[str, float] = {}
    for info in ctl.list():
        held[info.accelerator] = held.get(info.accelerator, 0.0) + info.num_accelerators
    return groups, {k: (v, float(total.get(k, 0.0))) for k, v in held.items()}
