"""A job's plan as the controller keeps it, the node slots it needs, and whether they can
ever fit.

The controller plans a configuration once, on the live cluster, and keeps the result:
slot replacement and drivers never plan again, so a driver or controller of another
placectl version can never compute other ranks from the same record.

**Fit**: whether a reservation can ever fit the nodes it is planned on.

Ray keeps a placement group that can never be placed pending forever, and a reserve that
waits for it waits its whole timeout for nothing. Each slot is pinned to one node, so a
slot that asks for more than its node has *in total* can never be placed, whatever other
jobs release and whether or not the cluster autoscales (a new node does not grow an old
one). Compared with totals, not with what is free: what others hold is a wait, not a
refusal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from controller.planning.cluster import NodeView
from controller.planning.components import ComponentPlacement
from controller.planning.node_groups import ACCELERATOR, HARDWARE, NODE
from controller.planning.placement import Placement
from controller.planning.spec import ClusterSpec
from controller.state.records import SCHEMA_VERSION, BundleRecord, SlotRecord

MIN_BUNDLE_CPU = 0.001  # node and hardware bundles need some resource for Ray to pin them


class ComponentPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One component's placements, logical: cluster node ranks and planned node-local
    accelerator indices (the probe later maps them to physical ids).

    Attributes:
        kind: what its processes hold: ``accelerator``, ``hardware``, ``node``, or
            ``mixed`` (each placement says what it holds).
        hardware: the Ray resource of its hardware units, as the cluster spells it.
        capture_child_tasks, engine: copied from the spec; see ComponentSpec.
    """

    name: str
    kind: str
    hardware: str | None = None
    capture_child_tasks: bool = False
    engine: str | None = None
    placements: list[Placement] = []

    @property
    def world_size(self) -> int:
        return len(self.placements)


class JobPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Every component of a job, in configuration order."""

    v: int = SCHEMA_VERSION
    components: list[ComponentPlan] = []

    @classmethod
    def of(cls, cp: ComponentPlacement) -> JobPlan:
        """The plan a :class:`ComponentPlacement` computed."""
        out = []
        for name in cp.components:
            comp = cp.spec.component(name)
            pool = cp.pool(name)
            out.append(
                ComponentPlan(
                    name=name,
                    kind=pool.kind,
                    hardware=pool.hardware,
                    capture_child_tasks=comp.starts_children,
                    engine=comp.engine,
                    placements=cp.placements(name),
                )
            )
        return cls(components=out)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]

    def component(self, name: str) -> ComponentPlan:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)

    def world_sizes(self) -> dict[str, int]:
        return {c.name: c.world_size for c in self.components}

    def node_ranks(self) -> list[int]:
        """Cluster node ranks the job uses, ascending."""
        return sorted({p.node_rank for c in self.components for p in c.placements})


BundleKey = tuple[str, str, int]  # (kind, hardware resource or "", node-local index)


def bundle_key(b: BundleRecord) -> BundleKey:
    """What a bundle is for, independent of the slot that holds it."""
    hardware = ""
    if b.kind == HARDWARE:
        hardware = next(k for k in b.resources if k != "CPU")
    return (b.kind, hardware, b.local_index)


def bundles_by_node(plan: JobPlan, spec: ClusterSpec) -> dict[int, dict[BundleKey, dict]]:
    """Every bundle each node needs: one per accelerator a process holds, and one per
    accelerator a hardware or node process sees (so no other job can take what it is
    shown), one per hardware unit, one CPU bundle for node-level processes."""
    used: dict[int, dict[BundleKey, dict[str, float]]] = {}
    cpu = max(spec.cpus_per_accelerator, MIN_BUNDLE_CPU)
    accel = {spec.accelerator: 1.0}
    if spec.cpus_per_accelerator > 0:
        accel["CPU"] = spec.cpus_per_accelerator
    for comp in plan.components:
        for p in comp.placements:
            bundles = used.setdefault(p.node_rank, {})
            if p.kind == ACCELERATOR:
                for g in p.local_resource_ranks:
                    bundles[(ACCELERATOR, "", g)] = dict(accel)
                continue
            for g in p.cuda_visible_devices:  # seen and held, not used: no CPU of its own
                bundles.setdefault((ACCELERATOR, "", g), {spec.accelerator: 1.0})
            if p.kind == HARDWARE:
                for u in p.local_resource_ranks:
                    bundles[(HARDWARE, p.hardware, u)] = {p.hardware: 1.0, "CPU": cpu}
            else:
                bundles[(NODE, "", -1)] = {"CPU": cpu}
    return used


_ORDER = {ACCELERATOR: 0, HARDWARE: 1, NODE: 2}


def ordered(keys) -> list[BundleKey]:
    """Bundle keys in the order a slot holds them: accelerators, hardware, node."""
    return sorted(keys, key=lambda k: (_ORDER[k[0]], k[1], k[2]))


def plan_slots(
    plan: JobPlan, spec: ClusterSpec, nodes: dict[int, NodeView], name_prefix: str
) -> list[SlotRecord]:
    """The slots (one per node the job uses) and their bundles, in node-rank order.

    Slot ``i``'s placement group is named ``f"{name_prefix}{i}"``.
    """
    used = bundles_by_node(plan, spec)
    slots = []
    for i, nr in enumerate(sorted(used)):
        node = nodes[nr]
        keys = ordered(used[nr])
        slots.append(
            SlotRecord(
                node_rank=nr,
                node_id=node.node_id,
                node_ip=node.ip,
                group_name=f"{name_prefix}{i}",
                bundles=[BundleRecord(k[0], k[2], used[nr][k]) for k in keys],
            )
        )
    return slots


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
