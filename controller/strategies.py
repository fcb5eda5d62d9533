"""Placement strategies: rules that choose resources for each process of a component.

Every strategy answers ``get_placement(view, isolate_gpu=True)`` with one
:class:`~controller.placement.Placement` per process, in rank order. The YAML parser
builds :class:`FlexiblePlacementStrategy` (accelerator and hardware groups) and
:class:`NodePlacementStrategy` (node-only groups); the packed and strided strategies are
for code that places workers without a configuration file.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from controller.cluster import ClusterView
from controller.colocation import ShareRequest, account
from controller.errors import PlacementError
from controller.node_groups import ACCELERATOR, NODE, ResourcePool, resolve_pool
from controller.placement import Placement, build_placements
from controller.spec import NodeGroup

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
        shares = None
        if pool.kind == ACCELERATOR:
            req = ShareRequest("", pool.unit_node, pool.unit_local, procs)
            shares = account([req])[0][0]
        return build_placements(
            pool, view, procs, isolate=self.isolate_gpu and isolate_gpu, shares=shares
        )

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


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


class FlexiblePlacementStrategy(PlacementStrategy):
    """Explicit resource ranks for each process: ``resource_ranks_per_process[rank]``.

    Ranks count the node group's resources (accelerators, hardware units or nodes);
    each process's resources must lie on one node.
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
            checked.append([_int(f"process {rank} resource", r, 0, cls) for r in ranks])
        self.resource_ranks_per_process = checked

    @classmethod
    def _from_plan(cls, procs: list[list[int]], groups: list[NodeGroup]):
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


class NodePlacementStrategy(PlacementStrategy):
    """One process per listed node rank (counted within the node group; repeats allowed).

    Processes placed this way hold a node, not an accelerator: their visible-devices
    list is empty.
    """

    def __init__(self, node_ranks: Sequence[int], node_group: GroupArg = None) -> None:
        super().__init__(node_group)
        cls = type(self).__name__
        if isinstance(node_ranks, (str, bytes)) or not node_ranks:
            raise PlacementError(f"{cls} node_ranks={node_ranks!r}: expected a non-empty list")
        self.node_ranks = [_int("node rank", r, 0, cls) for r in node_ranks]
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
