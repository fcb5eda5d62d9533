"""Packed placement: fill accelerators in order from a master node and accelerator."""

from __future__ import annotations

from controller.errors import PlacementError
from controller.planning.node_groups import ACCELERATOR, ResourcePool
from controller.planning.strategies.base import GroupArg, PlacementStrategy, _int


class PackedPlacementStrategy(PlacementStrategy):
    """Fill accelerators in order from ``(master_node, master_gpu)``.

    Each process takes a block of ``num_gpus_per_process`` accelerators spaced ``stride``
    apart on the current node (``stride`` processes interleave within a run of
    ``stride x num_gpus_per_process``); a block never spans nodes. Give exactly one of
    ``num_nodes`` (place as many processes as fit on that many nodes) and
    ``num_processes``. ``master_node`` counts among the node group's nodes.
    """

    def __init__(
        self,
        master_node: int = 0,
        master_gpu: int = 0,
        num_nodes: int | None = None,
        num_processes: int | None = None,
        num_gpus_per_process: int = 1,
        stride: int = 1,
        isolate_gpu: bool = True,
        node_group: GroupArg = None,
    ) -> None:
        super().__init__(node_group)
        cls = type(self).__name__
        self.master_node = _int("master_node", master_node, 0, cls)
        self.master_gpu = _int("master_gpu", master_gpu, 0, cls)
        if (num_nodes is None) == (num_processes is None):
            raise PlacementError(
                f"{cls}: give exactly one of num_nodes and num_processes "
                f"(got num_nodes={num_nodes!r}, num_processes={num_processes!r})"
            )
        self.num_nodes = None if num_nodes is None else _int("num_nodes", num_nodes, 1, cls)
        self.num_processes = (
            None if num_processes is None else _int("num_processes", num_processes, 1, cls)
        )
        self.num_gpus_per_process = _int("num_gpus_per_process", num_gpus_per_process, 1, cls)
        self.stride = _int("stride", stride, 1, cls)
        self.isolate_gpu = bool(isolate_gpu)

    def assign(self, pool: ResourcePool) -> list[list[int]]:
        cls = type(self).__name__
        if pool.kind != ACCELERATOR:
            raise PlacementError(f"{cls} places accelerators, but {pool.describe()}")
        by_node: dict[int, list[int]] = {}
        for uid, nr in enumerate(pool.unit_node):
            by_node.setdefault(nr, []).append(uid)
        nodes = list(by_node.values())
        if self.master_node >= len(nodes):
            raise PlacementError(
                f"{cls} master_node={self.master_node}: out of range, the group has "
                f"{len(nodes)} nodes with accelerators (0-{len(nodes) - 1})"
            )
        if self.master_gpu >= len(nodes[self.master_node]):
            raise PlacementError(
                f"{cls} master_gpu={self.master_gpu}: out of range, node {self.master_node} "
                f"has {len(nodes[self.master_node])} accelerators"
            )
        last = len(nodes) if self.num_nodes is None else self.master_node + self.num_nodes
        if last > len(nodes):
            raise PlacementError(
                f"{cls} master_node={self.master_node}, num_nodes={self.num_nodes}: the "
                f"group has only {len(nodes)} nodes with accelerators"
            )
        n, stride = self.num_gpus_per_process, self.stride
        width = n * stride
        want = self.num_processes
        procs: list[list[int]] = []
        for i in range(self.master_node, last):
            units = nodes[i][self.master_gpu :] if i == self.master_node else nodes[i]
            for g in range(0, len(units) - width + 1, width):
                for j in range(stride):
                    if want is not None and len(procs) == want:
                        return procs
                    procs.append([units[g + j + m * stride] for m in range(n)])
        if want is not None and len(procs) < want:
            raise PlacementError(
                f"{cls}: {want} processes of {n} accelerator(s) (stride {stride}) from node "
                f"{self.master_node} accelerator {self.master_gpu} do not fit; only "
                f"{len(procs)} do"
            )
        if not procs:
            raise PlacementError(f"{cls}: no process fits ({pool.describe()})")
        return procs
