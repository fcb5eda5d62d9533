"""Segments: groups of consecutive processes (a tensor- or expert-parallel group that spans
nodes) that must each stay within one NVLink domain or rack.

A component's ``topology: {segment: k, within: nvlink-domain}`` makes ranks
``[i*k, (i+1)*k)`` one segment. The plan is refused, naming the segment, its nodes and
their domains, where one would span two domains or sit on a node that states none: the
placement string decides the node ranks, and the node order keeps one domain's nodes
consecutive (:mod:`controller.planning.cluster`), so a block of whole domains is a block of
consecutive node ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.errors import PlacementError
from controller.planning.cluster import ClusterView
from controller.planning.placement import Placement
from controller.planning.ranks import format_ranks
from controller.planning.spec_model import SegmentRule
from controller.planning.topology import GPU_DOMAIN_LABEL, RACK_LABEL, place_of

HOW_TO_STATE = {
    "nvlink-domain": f"the label {GPU_DOMAIN_LABEL} or NeMo-RL's resource nvlink_domain_<id>",
    "rack": f"the label {RACK_LABEL}",
}


def check_segments(
    component: str, rule: SegmentRule, placements: Sequence[Placement], view: ClusterView
) -> None:
    """Refuse a plan in which a segment of ``component`` is not within one domain.

    Raises:
        PlacementError: the world size is not a multiple of the segment, a segment's node
            states no domain (or rack), or a segment spans two; the message names the
            processes, the node ranks and their domains, and what is allowed.
    """
    world, k = len(placements), rule.segment
    noun = "NVLink domain" if rule.within == "nvlink-domain" else "rack"
    if world % k:
        raise PlacementError(
            f"{component}: topology.segment {k} does not divide its {world} processes "
            f"(allowed: {', '.join(str(d) for d in range(1, world + 1) if world % d == 0)})"
        )
    places = [place_of(n.topology, rule.within) for n in view.nodes]
    for start in range(0, world, k):
        seg = placements[start : start + k]
        by_place: dict[str, list[int]] = {}
        for p in seg:
            nodes = by_place.setdefault(places[p.node_rank], [])
            if p.node_rank not in nodes:
                nodes.append(p.node_rank)
        what = f"{component}: processes {start}-{start + k - 1} (topology.segment {k})"
        if "" in by_place:
            raise PlacementError(
                f"{what} run on node rank(s) {format_ranks(by_place[''])}, which state no {noun}; "
                f"give every node {HOW_TO_STATE[rule.within]}, or remove topology from "
                f"{component}"
            )
        if len(by_place) > 1:
            listed = ", ".join(
                f"{place} (node rank {format_ranks(nodes)})" for place, nodes in by_place.items()
            )
            raise PlacementError(
                f"{what} span {noun}s {listed}; place each {k} consecutive processes on "
                f"nodes of one {noun} (node ranks of one {noun} are consecutive)"
            )


def floating_blocks(cp) -> dict[str, tuple[int, str]]:
    """For each floating group that holds a segmented component, the nodes one segment
    spans and what they must share, from a plan of ``cp`` (a ComponentPlacement built
    without the segment check)."""
    blocks: dict[str, tuple[int, str]] = {}
    for comp in cp.spec.components:
        rule = comp.topology
        if rule is None:
            continue
        placements = cp.placements(comp.name)
        span = max(
            (
                len({p.node_rank for p in placements[i : i + rule.segment]})
                for i in range(0, len(placements), rule.segment)
            ),
            default=1,
        )
        for label in comp.node_groups:
            if cp.spec.node_group(label).floating:
                b = max(span, blocks.get(label, (1, ""))[0])
                blocks[label] = (b, rule.within)
    return blocks


__all__ = ["HOW_TO_STATE", "check_segments", "floating_blocks", "place_of"]
