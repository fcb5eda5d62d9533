"""Flexible placement: explicit resource ranks for every process."""

from __future__ import annotations

from collections.abc import Sequence

from controller.errors import PlacementError
from controller.planning.node_groups import ResourcePool
from controller.planning.spec import NodeGroup
from controller.planning.strategies.base import GroupArg, PlacementStrategy, _int


class FlexiblePlacementStrategy(PlacementStrategy):
    """Explicit resource ranks for each process: ``resource_ranks_per_process[rank]``.

    Ranks count the node group's resources (accelerators, hardware units or nodes);
    each process's resources must lie on one node and be of one kind. As in RLinf, each
    process's list is sorted and must not repeat a rank, and processes are numbered in
    the order of their first resource rank.
    """

    def __init__(
        self, resource_ranks_per_process: Sequence[Sequence[int]], node_group: GroupArg = None
    ) -> None:
        super().__init__(node_group)
        cls = type(self).__name__
        if isinstance(resource_ranks_per_process, (str, bytes)) or not resource_ranks_per_process:
            raise PlacementError(
                f"{cls} resource_ranks_per_process={resource_ranks_per_process!r}: expected a "
                "non-empty list of lists of ints"
            )
        checked = []
        for rank, ranks in enumerate(resource_ranks_per_process):
            if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence) or not ranks:
                raise PlacementError(
                    f"{cls} process {rank}: expected a non-empty list of resource ranks, "
                    f"got {ranks!r}"
                )
            ints = sorted(_int(f"process {rank} resource", r, 0, cls) for r in ranks)
            if len(set(ints)) != len(ints):
                raise PlacementError(
                    f"{cls} process {rank}: resource ranks {list(ranks)!r} repeat a rank; "
                    "each resource may be listed once per process"
                )
            checked.append(ints)
        self.resource_ranks_per_process = sorted(checked, key=lambda ranks: ranks[0])

    @classmethod
    def from_plan(cls, procs: list[list[int]], groups: list[NodeGroup]):
        """Wrap ranks that the planner already validated, without checking them again."""
        self = cls.__new__(cls)
        PlacementStrategy.__init__(self, groups)
        self.resource_ranks_per_process = procs
        return self

    def assign(self, pool: ResourcePool) -> list[list[int]]:
        cls = type(self).__name__
        unit_node = pool.unit_node
        for rank, ranks in enumerate(self.resource_ranks_per_process):
            for r in ranks:
                if r >= pool.size:
                    raise PlacementError(
                        f"{cls} process {rank}: resource rank {r} is out of range; "
                        f"{pool.describe()}"
                    )
            nodes = {unit_node[r] for r in ranks}
            if len(nodes) > 1:
                raise PlacementError(
                    f"{cls} process {rank}: resources {ranks} span nodes {sorted(nodes)}; a "
                    "process never spans two nodes"
                )
        return self.resource_ranks_per_process
