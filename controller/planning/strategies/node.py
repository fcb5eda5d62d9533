"""Node placement: one process per listed node, holding the node rather than an accelerator."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from controller.errors import PlacementError
from controller.planning.node_groups import NODE, ResourcePool
from controller.planning.strategies.base import GroupArg, PlacementStrategy, _int


class NodePlacementStrategy(PlacementStrategy):
    """One process per listed node rank (counted within the node group; repeats allowed).
    The node ranks are sorted, as RLinf does.

    Processes placed this way hold a node, not an accelerator: they see every
    accelerator of their node (RLinf's behaviour) and hold none.
    """

    def __init__(self, node_ranks: Sequence[int], node_group: GroupArg = None) -> None:
        super().__init__(node_group)
        cls = type(self).__name__
        if isinstance(node_ranks, (str, bytes)) or not node_ranks:
            raise PlacementError(f"{cls} node_ranks={node_ranks!r}: expected a non-empty list")
        self.node_ranks = sorted(_int("node rank", r, 0, cls) for r in node_ranks)
        self.node_groups = [msgspec.structs.replace(g, nodes_only=True) for g in self.node_groups]

    def assign(self, pool: ResourcePool) -> list[list[int]]:
        if pool.kind != NODE:
            raise PlacementError(f"NodePlacementStrategy needs nodes, but {pool.describe()}")
        for r in self.node_ranks:
            if r >= pool.size:
                raise PlacementError(
                    f"NodePlacementStrategy node rank {r} is out of range; {pool.describe()}"
                )
        return [[r] for r in self.node_ranks]
