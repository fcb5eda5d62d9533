"""Strided placement: processes interleave within runs of accelerators."""

from __future__ import annotations

from controller.errors import PlacementError
from controller.planning.cluster import ClusterView
from controller.planning.node_groups import ResourcePool
from controller.planning.placement import Placement
from controller.planning.strategies.base import GroupArg
from controller.planning.strategies.packed import PackedPlacementStrategy


class StridedPlacementStrategy(PackedPlacementStrategy):
    """Interleave processes: in each run of ``stride x num_gpus_per_process``
    accelerators, process j takes ``[g+j, g+j+stride, …]``.

    Every node's accelerator count must divide into whole runs, and isolation is
    required (each process must see exactly its own accelerators).
    """

    def __init__(
        self,
        master_node: int = 0,
        num_nodes: int = 1,
        stride: int = 1,
        num_gpus_per_process: int = 1,
        isolate_gpu: bool = True,
        node_group: GroupArg = None,
    ) -> None:
        if not isolate_gpu:
            raise PlacementError(
                "StridedPlacementStrategy isolate_gpu=False: strided placement needs "
                "isolate_gpu=True"
            )
        super().__init__(
            master_node=master_node,
            num_nodes=num_nodes,
            num_gpus_per_process=num_gpus_per_process,
            stride=stride,
            node_group=node_group,
        )

    def assign(self, pool: ResourcePool) -> list[list[int]]:
        width = self.stride * self.num_gpus_per_process
        per_node: dict[int, int] = {}
        for nr in pool.unit_node:
            per_node[nr] = per_node.get(nr, 0) + 1
        chosen = list(per_node.items())[self.master_node : self.master_node + self.num_nodes]
        for nr, count in chosen:
            if count % width:
                raise PlacementError(
                    f"StridedPlacementStrategy stride={self.stride}, num_gpus_per_process="
                    f"{self.num_gpus_per_process}: node {nr} has {count} accelerators, "
                    f"not a multiple of {width}"
                )
        return super().assign(pool)

    def get_placement(self, view: ClusterView, isolate_gpu: bool = True) -> list[Placement]:
        if not isolate_gpu:
            raise PlacementError(
                "StridedPlacementStrategy.get_placement(isolate_gpu=False): strided "
                "placement needs isolate_gpu=True"
            )
        return super().get_placement(view, isolate_gpu)
