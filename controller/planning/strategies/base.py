"""The strategy base class: rules that choose resources for each process of a component.

Every strategy answers ``get_placement(view, isolate_gpu=True)`` with one
:class:`~controller.planning.placement.Placement` per process, in rank order. The YAML parser
builds :class:`FlexiblePlacementStrategy` (accelerator and hardware groups) and
:class:`NodePlacementStrategy` (node-only groups); the packed and strided strategies are
for code that places workers without a configuration file.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.errors import PlacementError
from controller.planning.cluster import ClusterView
from controller.planning.colocation import ShareRequest, account
from controller.planning.node_groups import ACCELERATOR, ResourcePool, resolve_pool
from controller.planning.placement import Placement, build_placements
from controller.planning.spec import NodeGroup

GroupArg = str | NodeGroup | Sequence[str | NodeGroup] | None


def _groups(node_group: GroupArg) -> list[NodeGroup]:
    items = (
        [node_group]
        if node_group is None or isinstance(node_group, (str, NodeGroup))
        else list(node_group)
    )
    out = []
    for item in items:
        if item is None or item == "cluster":
            out.append(NodeGroup(label="cluster"))
        elif item == "node":
            out.append(NodeGroup(label="node", nodes_only=True))
        elif isinstance(item, NodeGroup):
            out.append(item)
        else:
            raise PlacementError(
                f"node_group {item!r}: a strategy takes a NodeGroup from a ClusterSpec, or "
                "one of the reserved labels 'cluster' and 'node'"
            )
    if not out:
        raise PlacementError("node_group []: at least one node group is required")
    return out


def _int(name: str, value: object, low: int, cls: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PlacementError(f"{cls} {name}={value!r}: expected an int >= {low}")
    return value


class PlacementStrategy:
    """Base class: subclasses choose resource ranks for each process."""

    isolate_gpu: bool = True

    def __init__(self, node_group: GroupArg = None) -> None:
        self.node_groups = _groups(node_group)
        # Set by ComponentPlacement: how many nodes the reserved groups span, and the
        # nodes chosen for floating groups.
        self._num_nodes: int | None = None
        self._floating: dict[str, list[int]] | None = None

    def bind(
        self, num_nodes: int | None, floating: dict[str, list[int]] | None
    ) -> PlacementStrategy:
        """Tie the strategy to a configuration: how many nodes its reserved groups span,
        and the nodes chosen for floating groups (``ComponentPlacement`` does this)."""
        self._num_nodes, self._floating = num_nodes, floating
        return self

    def pool(self, view: ClusterView) -> ResourcePool:
        """The ranked resources this strategy chooses from on ``view``."""
        return resolve_pool(self.node_groups, view, self._num_nodes, self._floating)

    def assign(self, pool: ResourcePool) -> list[list[int]]:
        """Resource ranks (ids into ``pool``) of each process, in rank order."""
        raise NotImplementedError

    def get_placement(self, view: ClusterView, isolate_gpu: bool = True) -> list[Placement]:
        """Place every process on ``view``.

        Args:
            view: the cluster.
            isolate_gpu: False lets each process see all the accelerators its component
                holds on its node; isolation is on only if both this and the strategy's
                own setting are on.

        Raises:
            PlacementError: the strategy does not fit the cluster.
        """
        pool = self.pool(view)
        procs = self.assign(pool)
        kinds = pool.unit_kind or [pool.kind] * pool.size
        ranks = [r for r, units in enumerate(procs) if kinds[units[0]] == ACCELERATOR]
        shares = [0.0] * len(procs)
        if ranks:
            req = ShareRequest("", pool.unit_node, pool.unit_local, [procs[r] for r in ranks])
            for r, share in zip(ranks, account([req])[0][0].process, strict=True):
                shares[r] = share
        return build_placements(
            pool, view, procs, isolate=self.isolate_gpu and isolate_gpu, shares=shares
        )

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"
