"""The cluster's nodes as Ray last reported them, and the planner's view of them.

Kept from what the loop follows (Ray's node events, full reads at joins and full checks,
direct questions about a reservation's nodes), so that a reserve costs what its job
costs, not a read and a sort of the whole cluster.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from controller.planning.cluster import ClusterView, NodeView, order_nodes
from controller.runtime.io import NodeInfo
from controller.state.cordons import Cordon

_BOOKKEEPING = ("CPU", "memory", "object_store_memory")


def node_view(n: NodeInfo, accelerator: str) -> NodeView:
    """One node as the planner sees it."""
    custom = {
        k: v
        for k, v in n.resources.items()
        if k != accelerator and k not in _BOOKKEEPING and not k.startswith("node:")
    }
    return NodeView(
        num_gpus=int(n.resources.get(accelerator, 0)),
        resources=custom,
        labels=dict(n.labels),
        node_id=n.node_id,
        ip=n.ip,
        is_head=n.is_head,
    )


def live_view(
    nodes: list[NodeInfo],
    accelerator: str,
    cache: dict[str, tuple[NodeInfo, NodeView]] | None = None,
) -> ClusterView:
    """The alive nodes, in node-rank order, as the planner sees them. With ``cache``,
    a node's view is built again only when what Ray reports of it changed."""
    views = []
    for n in nodes:
        if not n.alive:
            continue
        hit = cache.get(n.node_id) if cache is not None else None
        if hit is not None and hit[0] == n:
            views.append(hit[1])
            continue
        view = node_view(n, accelerator)
        if cache is not None:
            cache[n.node_id] = (n, view)
        views.append(view)
    return ClusterView(nodes=order_nodes(views))


class ClusterNodes:
    """Which nodes are alive, what Ray says of each, which Ray is draining, which an
    operator cordoned, and the live view per accelerator: the nodes a plan or a spare
    may use (alive, not draining, not cordoned). A node an operator drained counts as
    draining, without a deadline, so its slots move as for Ray's drain."""

    def __init__(self) -> None:
        self._alive: set[str] = set()
        self._draining: dict[str, float] = {}  # node -> deadline (0: none)
        self._cordoned: dict[str, bool] = {}  # node -> drained too (controller.state.cordons)
        self._info: dict[str, NodeInfo] = {}
        self._version = 0  # grows whenever _info changes
        self._node_views: dict[str, dict[str, tuple[NodeInfo, NodeView]]] = {}
        self._views: dict[str, tuple[int, ClusterView]] = {}

    def alive(self, node_id: str) -> bool:
        return node_id in self._alive

    def __contains__(self, node_id: object) -> bool:
        """``node_id in nodes``: the node is alive."""
        return node_id in self._alive

    @property
    def draining(self) -> dict[str, float]:
        """The nodes Ray is draining, as last read, and those an operator drained: node
        id -> deadline (0: none)."""
        drained = {n: 0.0 for n, drain in self._cordoned.items() if drain}
        return {**drained, **self._draining}

    def set_cordoned(self, cordons: Mapping[str, Cordon]) -> None:
        """Take the operator's cordons (node -> its cordon); the view leaves them out."""
        cordoned = {n: c.drain for n, c in cordons.items()}
        if cordoned != self._cordoned:
            self._cordoned = dict(cordoned)
            self._version += 1

    def set_draining(self, draining: dict[str, float]) -> None:
        """Take Ray's draining nodes; the view leaves them out from now on."""
        if draining != self._draining:
            self._draining = dict(draining)
            self._version += 1

    def alive_ids(self) -> set[str]:
        """A copy of the alive set."""
        return set(self._alive)

    def info(self, node_id: str) -> NodeInfo | None:
        return self._info.get(node_id)

    def set_all(self, infos: list[NodeInfo]) -> bool:
        """Take Ray's full node list; True if a node joined since the last one."""
        alive = {n.node_id for n in infos if n.alive}
        joined = bool(alive - self._alive) and bool(self._info)
        self._alive = alive
        info = {n.node_id: n for n in infos}
        if info != self._info:  # unchanged nodes keep their views (and plans made on them)
            self._info = info
            self._version += 1
        return joined

    def joined(self, node_id: str) -> None:
        """A node joined (its full entry comes with the next full list)."""
        self._alive.add(node_id)

    def died(self, node_id: str) -> None:
        self._alive.discard(node_id)
        info = self._info.get(node_id)
        if info is not None and info.alive:
            self._info[node_id] = msgspec.structs.replace(info, alive=False)
            self._version += 1

    def view(self, accelerator: str) -> ClusterView:
        """The alive nodes in node-rank order, built again only when they changed."""
        cached = self._views.get(accelerator)
        if cached is not None and cached[0] == self._version:
            return cached[1]
        cache = self._node_views.setdefault(accelerator, {})
        out = self._draining.keys() | self._cordoned.keys()
        usable = [n for n in self._info.values() if n.node_id not in out]
        view = live_view(usable, accelerator, cache)
        self._views[accelerator] = (self._version, view)
        return view
