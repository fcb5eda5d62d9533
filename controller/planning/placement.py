"""The ``Placement`` record and the one function that turns resource choices into them."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from controller.errors import PlacementError
from controller.planning.cluster import ClusterView
from controller.planning.node_groups import ACCELERATOR, HARDWARE, ResourcePool


class Placement(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """Where one process of a component runs.

    Attributes:
        rank: the process's rank within its component.
        world_size: processes in the component.
        component: the component's name ("" from a bare strategy).
        node_group: label of the node group that holds its resources.
        node_rank: cluster node rank.
        node_id, node_ip: the node's Ray id and address (empty in a dry run).
        placement_node_rank: index of the node among the component's nodes, numbered
            in the order their lowest process rank appears; exported as NODE_RANK.
        resource_ranks: group-level resource ranks the process holds.
        local_resource_ranks: their node-local indices (empty for node resources).
        local_gpu_id: the first accelerator's node-local index, -1 if it holds none.
        cuda_visible_devices: what the visible-devices variable will hold. A process on
            a hardware unit or a node sees every accelerator of its node, as RLinf shows
            it (none with ``isolate: true``); it holds none of them.
        isolate_gpu: whether the process sees only its own accelerators.
        local_rank, local_world_size: the process's index among the component's
            processes on its node, and their count, in every mode (the ``LOCAL_RANK``
            variable follows the device rule of :mod:`controller.state.environment`).
        accelerator_share: fraction of its first accelerator the process requests
            (0.0 when it holds none).
        child_share: for an engine, the fraction of each of its accelerators one of its
            children may request (0.0 for processes that start no children).
        kind: what it holds: ``accelerator``, ``hardware`` or ``node``.
        hardware: for a hardware process, the Ray resource of its units.
    """

    rank: int
    world_size: int
    component: str
    node_group: str
    node_rank: int
    node_id: str
    node_ip: str
    placement_node_rank: int
    resource_ranks: list[int]
    local_resource_ranks: list[int]
    local_gpu_id: int
    cuda_visible_devices: list[int]
    isolate_gpu: bool
    local_rank: int
    local_world_size: int
    accelerator_share: float = 0.0
    child_share: float = 0.0
    kind: str = ACCELERATOR
    hardware: str = ""


def build_placements(
    pool: ResourcePool,
    view: ClusterView,
    procs: Sequence[Sequence[int]],
    *,
    component: str = "",
    isolate: bool = True,
    shares: Sequence[float] | None = None,
    child_shares: Sequence[float] | None = None,
    node_accelerators: bool = True,
) -> list[Placement]:
    """Placements for processes whose resources are ``procs[rank]`` (unit ids of ``pool``).

    Every process's units must lie on one node; callers check that and say which
    input broke it. ``shares`` and ``child_shares`` are indexed by rank (accelerator
    processes only). ``node_accelerators``: a process on a hardware unit or a node sees
    every accelerator of its node (RLinf's behaviour), else none.

    Raises:
        PlacementError: a process would hold resources of two kinds.
    """
    unit_node, unit_local, unit_group = pool.unit_node, pool.unit_local, pool.unit_group
    kind_of = pool.unit_kind or [pool.kind] * pool.size
    hw_of = pool.unit_hardware or [pool.hardware] * pool.size
    for rank, units in enumerate(procs):
        kinds = {(kind_of[u], hw_of[u]) for u in units}
        if len(kinds) > 1:
            listed = " and ".join(sorted(hw or k for k, hw in kinds))
            raise PlacementError(
                f"process {rank} of {component or 'the component'} would hold {listed} "
                f"(resources {list(units)}); a process holds one kind of resource"
            )
    node_of = [unit_node[units[0]] for units in procs]
    order: dict[int, int] = {}
    counts: dict[int, int] = {}
    for nr in node_of:
        if nr not in order:
            order[nr] = len(order)
            counts[nr] = 0
        counts[nr] += 1

    visible: dict[int, list[int]] = {}
    if not isolate:
        held: dict[int, set[int]] = {}
        for units, nr in zip(procs, node_of, strict=True):
            if kind_of[units[0]] == ACCELERATOR:
                held.setdefault(nr, set()).update(unit_local[u] for u in units)
        visible = {nr: sorted(locals_) for nr, locals_ in held.items()}

    seen: dict[int, int] = dict.fromkeys(order, 0)
    world = len(procs)
    nodes = view.nodes
    out: list[Placement] = []
    append = out.append
    for rank, units in enumerate(procs):
        nr = node_of[rank]
        local_index = seen[nr]
        seen[nr] = local_index + 1
        node = nodes[nr]
        kind, hardware = kind_of[units[0]], hw_of[units[0]]
        if kind == ACCELERATOR:
            local = [unit_local[u] for u in units]
            gpu = local[0]
            cvd = local if isolate else visible[nr]
            share = shares[rank] if shares is not None else 1.0
            child = child_shares[rank] if child_shares is not None else 0.0
        else:
            local = [unit_local[u] for u in units] if kind == HARDWARE else []
            cvd = list(range(node.num_gpus)) if node_accelerators else []
            gpu, share, child = -1, 0.0, 0.0
        append(
            Placement(
                rank=rank,
                world_size=world,
                component=component,
                node_group=unit_group[units[0]],
                node_rank=nr,
                node_id=node.node_id,
                node_ip=node.ip,
                placement_node_rank=order[nr],
                resource_ranks=list(units),
                local_resource_ranks=local,
                local_gpu_id=gpu,
                cuda_visible_devices=cvd,
                isolate_gpu=isolate,
                local_rank=local_index,
                local_world_size=counts[nr],
                accelerator_share=share,
                child_share=child,
                kind=kind,
                hardware=hardware or "",
            )
        )
    return out
