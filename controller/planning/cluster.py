"""What the planner knows about a cluster: its nodes, in node-rank order."""

from __future__ import annotations

import functools

import msgspec

from controller.errors import PlacementError
from controller.planning.topology import Topology, topology_of, topology_order

NODE_RANK_LABEL = "placectl.io/node-rank"


class NodeView(msgspec.Struct, kw_only=True, frozen=True, dict=True):
    """One node as the planner sees it.

    Attributes:
        num_gpus: accelerators on the node (of the cluster's accelerator resource).
        resources: custom Ray resources, e.g. ``{"franka": 2}`` for two robot arms.
        labels: node labels, e.g. ``{"rack": "b"}``.
        node_id: Ray node id (hex); empty in a dry run.
        ip: node IP address; empty in a dry run.
        is_head: whether this is the Ray head node.
    """

    num_gpus: int = 0
    resources: dict[str, float] = {}
    labels: dict[str, str] = {}
    node_id: str = ""
    ip: str = ""
    is_head: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.num_gpus, bool) or not isinstance(self.num_gpus, int):
            raise PlacementError(
                f"NodeView num_gpus {self.num_gpus!r}: expected a non-negative int"
            )
        if self.num_gpus < 0:
            raise PlacementError(f"NodeView num_gpus {self.num_gpus}: must be >= 0")
        for name, amount in self.resources.items():
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
                raise PlacementError(
                    f"NodeView resource {name!r}={amount!r}: expected a non-negative number"
                )

    @functools.cached_property
    def topology(self) -> Topology:
        """Its NVLink domain, rack and topology rank, as its labels and resources say
        (read once: a repair compares every candidate's with the lost node's)."""
        return topology_of(self.labels, self.resources)

    def units(self, resource: str) -> int:
        """Whole units of a custom resource on this node (name matched case-insensitively)."""
        amount = self.resources.get(resource)
        if amount is None:
            folded = resource.lower()
            amount = next((v for k, v in self.resources.items() if k.lower() == folded), 0)
        return int(amount)


class ClusterView(msgspec.Struct, kw_only=True, frozen=True):
    """The nodes of a cluster; a node's rank is its position in ``nodes``."""

    nodes: list[NodeView]

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, list) or not all(isinstance(n, NodeView) for n in self.nodes):
            raise PlacementError("ClusterView nodes: expected a list of NodeView")

    @classmethod
    def uniform(cls, num_nodes: int, gpus_per_node: int, **node_fields) -> ClusterView:
        """A cluster of ``num_nodes`` identical nodes with ``gpus_per_node`` accelerators."""
        for name, value in (("num_nodes", num_nodes), ("gpus_per_node", gpus_per_node)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PlacementError(f"{name} {value!r}: expected an int >= 0")
        node = NodeView(num_gpus=gpus_per_node, **node_fields)
        return cls(nodes=[node] * num_nodes)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)


def _ip_key(ip: str) -> tuple:
    parts = ip.split(".")
    if len(parts) == 4 and all(p.isdigit() for p in parts):
        return (0, tuple(int(p) for p in parts))
    return (1, ip)


def order_nodes(nodes: list[NodeView]) -> list[NodeView]:
    """Sort nodes into node-rank order.

    If every node carries the ``placectl.io/node-rank`` label, that order. Otherwise the
    head node first, then by numeric IP, then by node id (raylets sharing one host); and
    where nodes state their topology (:mod:`controller.planning.topology`), that order
    is rearranged so that one NVLink domain's nodes, and within it one rack's, have
    consecutive ranks. The order depends only on the nodes, never on the order Ray
    listed them in.
    """
    labelled = [n.labels.get(NODE_RANK_LABEL) for n in nodes]
    if nodes and all(v is not None and v.strip().isdigit() for v in labelled):
        return sorted(nodes, key=lambda n: (int(n.labels[NODE_RANK_LABEL]), n.node_id))
    plain = sorted(nodes, key=lambda n: (not n.is_head, _ip_key(n.ip), n.node_id))
    return [plain[i] for i in topology_order([n.topology for n in plain])]


class _NodeEntry(NodeView, kw_only=True, forbid_unknown_fields=True):
    count: int = 1  # that many identical nodes


def load_cluster_view(source) -> ClusterView:
    """Read a cluster description: a list of nodes, or ``{nodes: [...]}``.

    Each node takes ``num_gpus``, ``resources``, ``labels``, ``node_id``, ``ip``,
    ``is_head`` and ``count`` (that many identical nodes). Node rank = position.

    Raises:
        PlacementError: unreadable input or a malformed node; the message names it.
    """
    from controller.planning.documents import convert, read_document

    data = read_document(source)
    if isinstance(data, dict) and "nodes" in data:
        data = data["nodes"]
    entries = convert(data, list[_NodeEntry], "nodes")
    nodes: list[NodeView] = []
    for i, e in enumerate(entries):
        if e.count < 0:
            raise PlacementError(f"nodes[{i}].count {e.count}: must be >= 0")
        node = NodeView(**{f: getattr(e, f) for f in NodeView.__struct_fields__})
        nodes.extend([node] * e.count)
    return ClusterView(nodes=nodes)
