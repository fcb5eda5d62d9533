"""What a reservation asks the cluster's autoscaler for, when the nodes it needs do not
exist: pure shapes, computed from a configuration or a lost slot and the live nodes.

An autoscaler (Ray's own, KubeRay's) adds nodes for the demand Ray reports: tasks,
actors and placement groups that wait for resources no node has free. A placectl
reservation that waits for nodes is no such thing (its groups are pinned to nodes that
exist), so it states its demand as placement groups of its own shape that can only be
placed on a node that does not exist yet: each bundle's label selector excludes the live
nodes that could hold it. Ray then reports them as pending demand, the autoscaler adds
nodes for them, and once one is placed a node has joined for it (see
:mod:`controller.runtime.core.nodes`, which holds them).

Which shape:

* **A reservation waiting for nodes** (fewer than ``num_nodes`` alive) asks first for
  the accelerators its placement strings count and the live nodes lack: whole nodes of
  ``num_gpus_per_node`` accelerators when the configuration states it (RLinf's key),
  else that many one-accelerator bundles packed as the autoscaler likes; once the
  accelerators are there, for the nodes still missing, one small bundle on each.
* **A slot without a spare** (its node lost, or draining) asks for one node of the same
  kind: the slot's bundles, as many accelerator bundles more as the lost node had,
  all on one node, with the lost node's kind labels.
"""

from __future__ import annotations

import msgspec

from controller.planning.cluster import ClusterView, NodeView
from controller.planning.ranks import parse_placement
from controller.planning.spec_model import ClusterSpec
from controller.state.records import SlotRecord
from controller.state.spares import kind_labels

PACK, STRICT_PACK, STRICT_SPREAD = "PACK", "STRICT_PACK", "STRICT_SPREAD"
NODE_ID_LABEL = "ray.io/node-id"
# A node's share of a demand that asks only for the node to exist.
NODE_BUNDLE = {"CPU": 0.01}
# At most this many live nodes are named in one selector; beyond it the demand excludes
# the nodes that could hold a bundle, which is what matters to the autoscaler.
MAX_AVOIDED = 2048


class DemandGroup(msgspec.Struct, frozen=True, kw_only=True):
    """One placement group of demand.

    Attributes:
        bundles: its bundles, as Ray resources.
        strategy: ``PACK`` (as the autoscaler packs them), ``STRICT_PACK`` (one node) or
            ``STRICT_SPREAD`` (one bundle per node).
        labels: labels the new node must carry (a lost node's kind).
        avoid: the live nodes it must not be placed on, so that it is placed only on a
            node that joins for it.
    """

    bundles: list[dict[str, float]]
    strategy: str = PACK
    labels: dict[str, str] = {}
    avoid: list[str] = []

    def selector(self) -> dict[str, str]:
        """Each bundle's label selector, in Ray's syntax."""
        out = dict(self.labels)
        if self.avoid:
            out[NODE_ID_LABEL] = f"!in({','.join(self.avoid)})"
        return out


class Want(msgspec.Struct, frozen=True, kw_only=True):
    """What one owner (a reserve waiting for nodes, a slot without a spare) asks for.

    Attributes:
        groups: the placement groups that state it.
        why: what it is for, in a few words, for progress and status lines.
    """

    groups: list[DemandGroup]
    why: str = ""

    def describe(self) -> str:
        """``2 x {CPU: 1, GPU: 4} on one node each``-style summary."""
        parts = []
        for g in self.groups:
            shapes: dict[tuple, int] = {}
            for b in g.bundles:
                key = tuple(sorted(b.items()))
                shapes[key] = shapes.get(key, 0) + 1
            text = " + ".join(
                f"{n} x {{{', '.join(f'{k}: {v:g}' for k, v in key)}}}" for key, n in shapes.items()
            )
            where = {STRICT_PACK: " on one node", STRICT_SPREAD: " on one node each"}
            labels = f" with {', '.join(f'{k}={v}' for k, v in g.labels.items())}"
            parts.append(text + where.get(g.strategy, "") + (labels if g.labels else ""))
        return "; ".join(parts)


def _fits(node: NodeView, bundle: dict[str, float], accelerator: str) -> bool:
    for k, v in bundle.items():
        if k == accelerator:
            have = node.num_gpus
        elif k in ("CPU", "memory", "object_store_memory"):
            continue  # not in the planner's view; any node may have enough
        else:
            have = node.resources.get(k, 0.0)
        if have + 1e-9 < v:
            return False
    return True


def avoided(view: ClusterView, bundles: list[dict[str, float]], accelerator: str) -> list[str]:
    """The live nodes that could hold one of ``bundles``: a demand must not land there."""
    ids = [n.node_id for n in view.nodes if any(_fits(n, b, accelerator) for b in bundles)]
    if len(ids) > MAX_AVOIDED:
        ids = ids[:MAX_AVOIDED]
    return sorted(ids)


def accelerators_named(spec: ClusterSpec) -> int:
    """The accelerators a configuration's placement strings count on its accelerator
    groups (``cluster`` and the named groups without hardware or ``nodes_only``): the
    highest resource rank written, plus one. ``all`` counts none (it takes what is
    there)."""
    needed = 0
    for c in spec.components:
        groups = [spec.node_group(label) for label in c.node_groups]
        if any(g.label == "node" or g.hardware or g.nodes_only for g in groups):
            continue
        for seg in parse_placement(c.placement, f"component {c.name!r} placement"):
            if seg.resources is not None:
                needed = max(needed, seg.resources[1] + 1)
    return needed


def for_missing_nodes(
    spec: ClusterSpec, view: ClusterView, alive: ClusterView | None = None
) -> Want | None:
    """What a reservation of ``spec`` asks for while ``view`` (the nodes it may use) has
    fewer than ``spec.num_nodes``; None when nothing is missing. Its demand avoids every
    node of ``alive`` (default ``view``): a node out of placement is no new node."""
    missing = spec.num_nodes - view.num_nodes
    if missing <= 0:
        return None
    alive = alive or view
    acc = spec.accelerator
    have = sum(n.num_gpus for n in view.nodes)
    short = accelerators_named(spec) - have
    per_acc = {acc: 1.0, "CPU": float(spec.cpus_per_accelerator)}
    per_acc = {k: v for k, v in per_acc.items() if v > 0}
    if short > 0:
        gpn = spec.num_gpus_per_node or 0
        if gpn > 0:
            nodes = min(missing, -(-short // gpn))
            group = DemandGroup(
                bundles=[per_acc] * gpn,
                strategy=STRICT_PACK,
                avoid=avoided(alive, [per_acc], acc),
            )
            return Want(
                groups=[group] * nodes,
                why=f"{short} {acc} more than the {view.num_nodes} live nodes have",
            )
        return Want(
            groups=[DemandGroup(bundles=[per_acc] * short, avoid=avoided(alive, [per_acc], acc))],
            why=f"{short} {acc} more than the {view.num_nodes} live nodes have",
        )
    return Want(
        groups=[
            DemandGroup(
                bundles=[NODE_BUNDLE] * missing,
                strategy=STRICT_SPREAD,
                avoid=avoided(alive, [NODE_BUNDLE], acc),
            )
        ],
        why=f"{missing} more node(s): num_nodes={spec.num_nodes}, {view.num_nodes} alive",
    )


def for_spare(slots: list[SlotRecord], lost: NodeView, view: ClusterView, accelerator: str) -> Want:
    """What slots without a spare ask for: per slot, one node of ``lost``'s kind (its
    accelerators, its kind labels) with room for the slot's bundles."""
    groups = []
    for slot in slots:
        bundles = [dict(b.resources) for b in slot.bundles]
        held = sum(b.get(accelerator, 0.0) > 0 for b in bundles)
        bundles += [{accelerator: 1.0}] * max(0, lost.num_gpus - held)
        groups.append(
            DemandGroup(
                bundles=bundles,
                strategy=STRICT_PACK,
                labels=kind_labels(lost),
                avoid=avoided(view, bundles, accelerator),
            )
        )
    return Want(groups=groups, why=f"a spare of the kind of node {lost.ip or lost.node_id[:12]}")
