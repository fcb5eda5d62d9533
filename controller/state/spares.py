"""Which live node may stand in for a lost one: the same kind, with room for the slot."""

from __future__ import annotations

from collections.abc import Iterable

from controller.planning.cluster import NODE_RANK_LABEL, NodeView

# Ray's labels that say what a node is (not which node): a spare must match them.
KIND_LABELS = ("ray.io/accelerator-type", "ray.io/node-group", "ray.io/market-type")


def kind_labels(node: NodeView) -> dict[str, str]:
    """The labels that describe the kind of a node: Ray's kind labels and every user
    label except those that name one node (``ray.io/*`` ids and zones, the rank label)."""
    return {
        k: v
        for k, v in node.labels.items()
        if (k in KIND_LABELS or not k.startswith("ray.io/")) and k != NODE_RANK_LABEL
    }


def is_replacement(dead: NodeView, candidate: NodeView) -> bool:
    """Whether ``candidate`` is the same kind of node as ``dead``: the same accelerators,
    custom resources (``accelerator_type:*`` included) and kind labels."""
    return (
        candidate.num_gpus == dead.num_gpus
        and candidate.resources == dead.resources
        and kind_labels(candidate) == kind_labels(dead)
    )


def matches(node: NodeView, selectors: Iterable[dict[str, str]]) -> bool:
    """Whether ``node``'s labels satisfy every selector (a floating group's)."""
    return all(node.labels.get(k) == v for sel in selectors for k, v in sel.items())


def choose_spare(
    dead: NodeView,
    candidates: list[NodeView],
    free: dict[str, dict[str, float]],
    need: dict[str, float],
    exclude: set[str],
    selectors: Iterable[dict[str, str]] = (),
) -> NodeView | None:
    """The first candidate (in node-rank order) that can stand in for ``dead``: the same
    kind of node, matching ``selectors``, not in ``exclude``, with ``need`` free."""
    selectors = list(selectors)
    for node in candidates:
        if node.node_id in exclude or not is_replacement(dead, node):
            continue
        if not matches(node, selectors):
            continue
        have = free.get(node.node_id, {})
        if all(have.get(k, 0.0) + 1e-9 >= v for k, v in need.items()):
            return node
    return None
