"""Which live node may stand in for a lost one: the same kind, with room for the slot,
nearest first (the same NVLink domain, then the same rack)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from controller.planning.cluster import NODE_RANK_LABEL, NodeView
from controller.planning.spec_model import ClusterSpec
from controller.planning.topology import (
    NVLINK_RESOURCE_PREFIX,
    RACK_LABEL,
    TOPO_RANK_LABEL,
    TOPO_RANK_RESOURCE,
    place_of,
)
from controller.state.plan import JobPlan

# Ray's labels that say what a node is (not which node): a spare must match them.
KIND_LABELS = ("ray.io/accelerator-type", "ray.io/node-group", "ray.io/market-type")
# Labels that say where a node is, not what it is: nearness, not kind.
PLACE_LABELS = (NODE_RANK_LABEL, RACK_LABEL, TOPO_RANK_LABEL)


def _kind_resources(node: NodeView) -> dict[str, float]:
    return {
        k: v
        for k, v in node.resources.items()
        if not k.startswith(NVLINK_RESOURCE_PREFIX) and k != TOPO_RANK_RESOURCE
    }


def kind_labels(node: NodeView) -> dict[str, str]:
    """The labels that describe the kind of a node: Ray's kind labels and every user
    label except those that name one node or its place (``ray.io/*`` ids, zones and
    domains, the rank, rack and topology-rank labels)."""
    return {
        k: v
        for k, v in node.labels.items()
        if (k in KIND_LABELS or not k.startswith("ray.io/")) and k not in PLACE_LABELS
    }


def is_replacement(dead: NodeView, candidate: NodeView) -> bool:
    """Whether ``candidate`` is the same kind of node as ``dead``: the same accelerators,
    custom resources (``accelerator_type:*`` included; NeMo-RL's per-node topology
    resources are where a node is, not what it is) and kind labels."""
    return (
        candidate.num_gpus == dead.num_gpus
        and _kind_resources(candidate) == _kind_resources(dead)
        and kind_labels(candidate) == kind_labels(dead)
    )


def nearness(dead: NodeView, candidate: NodeView) -> tuple[int, int]:
    """How far ``candidate`` is from ``dead`` in the interconnect: (0, _) in the same
    NVLink domain, then (_, 0) in the same rack; unknown counts as far."""
    a, b = dead.topology, candidate.topology
    return (
        0 if a.domain and a.domain == b.domain else 1,
        0 if a.rack and a.rack == b.rack else 1,
    )


def matches(node: NodeView, selectors: Iterable[dict[str, str]]) -> bool:
    """Whether ``node``'s labels satisfy every selector (a floating group's)."""
    return all(node.labels.get(k) == v for sel in selectors for k, v in sel.items())


class Keep(msgspec.Struct, frozen=True, kw_only=True):
    """A lost node's spare must be in the same NVLink domain (or rack) as it was.

    Attributes:
        within: ``nvlink-domain`` or ``rack``.
        place: the domain (or rack) it was in.
        component: the component whose segment it holds (``topology.on_loss: wait``).
        segment: that component's segment size.
    """

    within: str
    place: str
    component: str
    segment: int

    def describe(self) -> str:
        noun = "NVLink domain" if self.within == "nvlink-domain" else "rack"
        return (
            f"in {noun} {self.place} ({self.component} keeps topology.segment "
            f"{self.segment} within {self.within}; on_loss: span would take one elsewhere)"
        )


def segments_kept(spec: ClusterSpec, plan: JobPlan, node_rank: int, lost: NodeView) -> list[Keep]:
    """What a spare for the node at ``node_rank`` must share with ``lost``: the domain (or
    rack) of every segment of a ``wait`` component that has a process there."""
    keeps = []
    for comp in spec.components:
        rule = comp.topology
        if rule is None or rule.on_loss != "wait":
            continue
        placements = plan.component(comp.name).placements
        if any(p.node_rank == node_rank for p in placements):
            place = place_of(lost.topology, rule.within)
            if place:
                keeps.append(
                    Keep(within=rule.within, place=place, component=comp.name, segment=rule.segment)
                )
    return keeps


def choose_spare(
    dead: NodeView,
    candidates: list[NodeView],
    free: dict[str, dict[str, float]],
    need: dict[str, float],
    exclude: set[str],
    selectors: Iterable[dict[str, str]] = (),
    keep: Sequence[Keep] = (),
) -> NodeView | None:
    """The nearest candidate (by :func:`nearness`, then node-rank order) that can stand
    in for ``dead``: the same kind of node, matching ``selectors``, in every domain or
    rack ``keep`` names, not in ``exclude``, with ``need`` free."""
    selectors = list(selectors)
    for node in sorted(candidates, key=lambda n: nearness(dead, n)):
        if node.node_id in exclude or not is_replacement(dead, node):
            continue
        if not matches(node, selectors):
            continue
        if any(place_of(node.topology, k.within) != k.place for k in keep):
            continue
        have = free.get(node.node_id, {})
        if all(have.get(k, 0.0) + 1e-9 >= v for k, v in need.items()):
            return node
    return None
