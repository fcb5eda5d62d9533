"""Node groups resolved against a cluster: the ranked resources a component may use.

What a resource is, for each selected group: its hardware units if it declares hardware;
else its nodes if it ignores hardware; else its accelerators if its nodes have any; else
its nodes. Ranks count across a group's nodes in node-rank order and across several
groups in the listed order. As in RLinf, one component's groups may hold different kinds
(accelerators of one group, robot arms of another) and may share a node, as long as no
unit is counted twice; if any of them holds nodes, all of them count as nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from controller.errors import PlacementError
from controller.planning.cluster import ClusterView
from controller.planning.spec import NodeGroup
from controller.planning.topology import place_of

ACCELERATOR, HARDWARE, NODE = "accelerator", "hardware", "node"


MIXED = "mixed"


class ResourcePool(msgspec.Struct, frozen=True):
    """Ranked resources of one or several node groups.

    Unit ``i`` (its resource rank) lives on cluster node ``unit_node[i]`` at node-local
    index ``unit_local[i]`` (-1 for a node resource), belongs to ``unit_group[i]`` and is
    of kind ``unit_kind[i]`` (for hardware, the Ray resource ``unit_hardware[i]``).
    ``kind`` and ``hardware`` describe the whole pool: one kind, or ``mixed``.
    """

    kind: str
    labels: list[str]
    unit_node: list[int]
    unit_local: list[int]
    unit_group: list[str]
    hardware: str | None = None
    unit_kind: list[str] = []
    unit_hardware: list[str | None] = []

    @property
    def size(self) -> int:
        return len(self.unit_node)

    def noun(self) -> str:
        if self.kind == HARDWARE:
            return f"{self.hardware} units"
        if self.kind == MIXED:
            return "resources"
        return "accelerators" if self.kind == ACCELERATOR else "nodes"

    def kind_of(self, unit: int) -> tuple[str, str | None]:
        """The kind (and hardware resource) of one unit."""
        return self.unit_kind[unit], self.unit_hardware[unit]

    def describe(self) -> str:
        """E.g. ``node group 'a800' has 16 accelerators (0-15)``."""
        names = ", ".join(repr(label) for label in self.labels)
        group = f"node group {names}" if len(self.labels) == 1 else f"node groups {names}"
        span = f" (0-{self.size - 1})" if self.size else ""
        return f"{group} has {self.size} {self.noun()}{span}"


def resolve_hardware(group: NodeGroup, view: ClusterView, ranks: list[int]) -> str:
    """The Ray resource name of a group's hardware, as its nodes spell it.

    ``hardware.type`` is matched without regard to case (RLinf writes ``Franka`` where a
    node offers ``franka``); the bundles must then ask for the name the nodes use. With
    no node offering it (a dry run), the name as written.

    Raises:
        PlacementError: the group's nodes spell the resource in more than one way.
    """
    wanted = (group.hardware or "").lower()
    names = sorted({k for r in ranks for k in view.nodes[r].resources if k.lower() == wanted})
    if len(names) > 1:
        raise PlacementError(
            f"node group {group.label!r}: hardware {group.hardware!r} matches resources "
            f"{names} on its nodes; spell it the same way on every node"
        )
    return names[0] if names else group.hardware or ""


def resolve_floating(group: NodeGroup, view: ClusterView) -> list[int]:
    """Node ranks of a floating group: the first ``count`` nodes whose labels match."""
    if group.selector is None:
        raise PlacementError(f"node group {group.label!r} is not a floating group")
    matches = [
        rank
        for rank, node in enumerate(view.nodes)
        if all(node.labels.get(k) == v for k, v in group.selector.items())
    ]
    if len(matches) < group.count:
        raise PlacementError(
            f"node group {group.label!r} needs {group.count} nodes matching "
            f"{group.selector}, the cluster has {len(matches)}"
        )
    return matches[: group.count]


def group_node_ranks(
    group: NodeGroup,
    view: ClusterView,
    num_nodes: int,
    floating: dict[str, list[int]] | None = None,
) -> list[int]:
    """Cluster node ranks of a group, checked against the view."""
    if group.floating:
        if floating and group.label in floating:
            ranks = list(floating[group.label])
        else:
            ranks = resolve_floating(group, view)
    elif group.node_ranks is None:
        ranks = list(range(num_nodes))
    else:
        ranks = group.node_ranks
    for r in ranks:
        if not 0 <= r < view.num_nodes:
            raise PlacementError(
                f"node group {group.label!r} uses node rank {r}, but the cluster has "
                f"{view.num_nodes} nodes (0-{view.num_nodes - 1})"
            )
    return ranks


def resolve_pool(
    groups: Sequence[NodeGroup],
    view: ClusterView,
    num_nodes: int | None = None,
    floating: dict[str, list[int]] | None = None,
) -> ResourcePool:
    """Rank the resources of ``groups`` (in the listed order) on ``view``.

    Args:
        groups: the selected node groups.
        view: the cluster.
        num_nodes: how many nodes the reserved groups span; default all of the view.
        floating: node ranks already chosen for floating groups, by label.

    Raises:
        PlacementError: groups that count the same unit twice (two groups of the same
            kind sharing a node), or that name nodes the cluster does not have.
    """
    num_nodes = view.num_nodes if num_nodes is None else num_nodes
    resolved = []
    for group in groups:
        ranks = group_node_ranks(group, view, num_nodes, floating)
        if group.nodes_only:
            kind = NODE
        elif group.hardware is not None:
            kind = HARDWARE
        elif not any(view.nodes[r].num_gpus for r in ranks):
            kind = NODE
        else:
            kind = ACCELERATOR
        hardware = resolve_hardware(group, view, ranks) if kind == HARDWARE else None
        resolved.append((group, ranks, kind, hardware))
    if any(kind == NODE for _, _, kind, _ in resolved):  # RLinf: then all count as nodes
        resolved = [(g, ranks, NODE, None) for g, ranks, _, _ in resolved]
    unit_node: list[int] = []
    unit_local: list[int] = []
    unit_group: list[str] = []
    unit_kind: list[str] = []
    unit_hardware: list[str | None] = []
    owner: dict[tuple[int, str, str | None], str] = {}
    for group, ranks, kind, hardware in resolved:
        for r in ranks:
            key = (r, kind, hardware.lower() if hardware else None)
            if key in owner:
                what = {NODE: "the node itself", ACCELERATOR: "its accelerators"}.get(
                    kind, f"its {hardware} units"
                )
                raise PlacementError(
                    f"node groups {owner[key]!r} and {group.label!r} both contain node {r} "
                    f"and would count {what} twice; groups of one component may share a "
                    "node only if they hold different kinds of resource"
                )
            owner[key] = group.label
            if kind == NODE:
                count = 1
            elif kind == ACCELERATOR:
                count = view.nodes[r].num_gpus
            elif group.hardware_units is not None:
                count = group.hardware_units.get(r, 0)
            else:
                count = view.nodes[r].units(group.hardware)
            unit_node.extend([r] * count)
            unit_local.extend(range(count) if kind != NODE else [-1])
            unit_group.extend([group.label] * count)
            unit_kind.extend([kind] * count)
            unit_hardware.extend([hardware] * count)
    kinds = {(k, hw) for _, _, k, hw in resolved}
    kind, hardware = (
        next(iter(kinds)) if len(kinds) == 1 else ((MIXED, None) if kinds else (NODE, None))
    )
    return ResourcePool(
        kind=kind,
        labels=[g.label for g in groups],
        unit_node=unit_node,
        unit_local=unit_local,
        unit_group=unit_group,
        hardware=hardware,
        unit_kind=unit_kind,
        unit_hardware=unit_hardware,
    )


def choose_floating(
    groups: Sequence[NodeGroup],
    view: ClusterView,
    free: dict[str, dict[str, float]],
    accelerator: str,
    blocks: dict[str, tuple[int, str]] | None = None,
) -> dict[str, list[int]]:
    """Nodes for each floating group: matching nodes with the most free resources.

    Among the nodes whose labels match the selector, those with more free accelerators
    (or free units of the group's hardware) come first; ties go to the lower node rank.
    A group in ``blocks`` (``(b, within)``: each segment of a component on it spans
    ``b`` nodes that must share an NVLink domain or rack) takes whole blocks of ``b``
    nodes from one domain at a time, in node order, skipping a domain's remainder.
    The chosen ranks are returned in node-rank order.
    """
    chosen: dict[str, list[int]] = {}
    taken: set[int] = set()
    for group in groups:
        if not group.floating:
            continue
        resource = group.hardware or accelerator
        candidates = [
            r
            for r, node in enumerate(view.nodes)
            if r not in taken
            and all(node.labels.get(k) == v for k, v in (group.selector or {}).items())
        ]
        candidates.sort(key=lambda r: (-free.get(view.nodes[r].node_id, {}).get(resource, 0), r))
        if len(candidates) < group.count:
            raise PlacementError(
                f"node group {group.label!r} needs {group.count} nodes matching "
                f"{group.selector}, the cluster has {len(candidates)} free"
            )
        block = (blocks or {}).get(group.label)
        picked = _whole_blocks(group, view, candidates, *block) if block else candidates
        chosen[group.label] = sorted(picked[: group.count])
        taken.update(chosen[group.label])
    return chosen


def _whole_blocks(
    group: NodeGroup, view: ClusterView, candidates: list[int], b: int, within: str
) -> list[int]:
    """``group.count`` of ``candidates`` in whole blocks of ``b`` nodes of one domain."""
    noun = "NVLink domain" if within == "nvlink-domain" else "rack"
    if group.count % b:
        raise PlacementError(
            f"node group {group.label!r}: count {group.count} is not a multiple of the {b} "
            f"nodes each segment on it spans; segments could not each stay in one {noun}"
        )
    by_place: dict[str, list[int]] = {}
    for r in candidates:
        by_place.setdefault(place_of(view.nodes[r].topology, within), []).append(r)
    picked: list[int] = []
    for place in sorted(by_place, key=lambda p: min(by_place[p])):
        if place and len(picked) < group.count:
            usable = len(by_place[place]) // b * b
            picked.extend(by_place[place][: min(usable, group.count - len(picked))])
    if len(picked) < group.count:
        free = ", ".join(f"{p or '(none)'}: {len(rs)}" for p, rs in by_place.items())
        raise PlacementError(
            f"node group {group.label!r} needs {group.count} nodes matching "
            f"{group.selector} in whole blocks of {b} per {noun}; free matching nodes by "
            f"{noun}: {free}"
        )
    return picked
