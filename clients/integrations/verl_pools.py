"""verl's resource pools on placectl: a pool is one component of a reservation.

verl's own pool (``RayResourcePool``) makes a placement group per node whose bundles each
hold one GPU and ``max_colocate_count`` CPUs, and lets up to ``max_colocate_count`` worker
groups share every bundle, each worker asking ``1/max_colocate_count`` of its GPU: that
is how verl's trainers put an actor, a critic, a reference and a reward model on one pool.
A placectl pool keeps that contract on the reservation's bundles: each rank's share
(what placectl accounted for the component's rank: a whole GPU, or its part of a
colocated one) is split among up to ``max_colocate_count`` groups, each worker asking
``share / max_colocate_count`` of its accelerator and CPUs. The group after the last one
that fits is refused when it is made, naming the pool, its groups and what the new one
would ask, instead of starting actors Ray can never place.

Written against verl 0.9.1 (``VERL_VERSION``); imported only when used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from clients.integrations import warn_if_not
from controller.errors import PlacementError
from controller.planning.colocation import floor_share
from controller.state.assignments import Assignment

VERL_VERSION = "0.9.1"

try:
    from verl.single_controller.ray.base import (
        RayClassWithInitArgs,
        RayResourcePool,
        RayWorkerGroup,
        ResourcePoolManager,
        create_colocated_worker_cls,
    )
except ImportError as e:  # pragma: no cover - exercised only without verl
    raise PlacementError(
        f"the verl integration needs verl (written against {VERL_VERSION}): "
        f"pip install verl=={VERL_VERSION} ({e})"
    ) from None

warn_if_not("verl", VERL_VERSION, "verl")

# verl's own default: how many worker groups a RayResourcePool lets share each bundle.
VERL_MAX_COLOCATE_COUNT = 10


def check_colocate_count(value: Any) -> int:
    """``max_colocate_count`` as verl takes it: a whole number of groups, 1 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlacementError(
            f"max_colocate_count={value!r}: the number of worker groups that share each "
            f"rank of a pool, a whole number 1 or more (verl's default: {VERL_MAX_COLOCATE_COUNT})"
        )
    return value


class PlacectlResourcePool(RayResourcePool):
    """A verl resource pool made of one component of a placectl reservation.

    ``world_size``, ``store`` (processes per node) and ``local_world_size_list`` are
    placectl's; placement groups are the reservation's and nobody creates others. Up to
    ``max_colocate_count`` worker groups share it, each worker asking that fraction of
    its rank's share (:meth:`worker_assignment`), as on verl's own pool.

    Args:
        reservation: a :class:`clients.Reservation`.
        component: the component whose ranks become verl's ranks.
        assignments: the assignments to use (default: the component's).
        name_prefix: verl's name prefix for the workers.
        detached: start the workers detached (named, re-attachable with :func:`attach`).
        max_colocate_count: how many worker groups share each rank (verl's default, 10).

    Raises:
        PlacementError: ``max_colocate_count`` is not a whole number 1 or more.
    """

    def __init__(
        self,
        reservation: Any,
        component: str,
        assignments: list[Assignment] | None = None,
        name_prefix: str | None = None,
        detached: bool = False,
        max_colocate_count: int = VERL_MAX_COLOCATE_COUNT,
    ) -> None:
        count = check_colocate_count(max_colocate_count)
        assignments = assignments if assignments is not None else reservation.assignments(component)
        super().__init__(
            process_on_nodes=_process_on_nodes(assignments),
            use_gpu=any(a.placement.local_gpu_id >= 0 for a in assignments),
            name_prefix=name_prefix or f"{reservation.job}.{component}.",
            max_colocate_count=count,
            detached=detached,
        )
        self.reservation, self.component = reservation, component
        self.assignments = assignments
        self.fused = False  # several roles in one process (colocated_worker_group)
        self.groups: list[str] = []  # the worker groups made on it, by name prefix

    def worker_assignment(self, a: Assignment) -> Assignment:
        """``a`` as one group's worker takes it: ``1/max_colocate_count`` of the rank's
        accelerator share, CPUs and other resources."""
        n = self.max_colocate_count
        if n == 1:
            return a
        return msgspec.structs.replace(
            a,
            num_gpus=a.num_gpus / n,
            num_cpus=floor_share(a.num_cpus / n),
            resources={k: v / n for k, v in a.resources.items()},
        )

    def take(self, group: str) -> None:
        """A worker group named ``group`` is being made on the pool.

        Raises:
            PlacementError: the pool's ``max_colocate_count`` groups hold every share:
                the new group's workers could never be placed.
        """
        n = self.max_colocate_count
        if len(self.groups) >= n:
            share = self.assignments[0].num_gpus if self.assignments else 0.0
            raise PlacementError(
                f"pool {self.name_prefix!r} ({self.reservation.job}/{self.component}) is full: "
                f"its {n} worker group(s) ({', '.join(self.groups)}) hold 1/{n} of each rank's "
                f"share each ({share:g} GPU a rank), and group {group!r} asks 1/{n} more; make "
                f"the pool with a larger max_colocate_count, or the group on another pool"
            )
        self.groups.append(group)

    def get_placement_groups(self, *args: Any, **kwargs: Any):
        raise PlacementError(
            f"the placectl pool of {self.reservation.job}/{self.component} places each rank "
            "itself: create the worker group with "
            "clients.integrations.verl.PlacectlWorkerGroup (ray_worker_group_cls=...)"
        )


def _process_on_nodes(assignments: list[Assignment]) -> list[int]:
    """verl's ``process_on_nodes``: processes per node, in the order of NODE_RANK."""
    counts: dict[int, int] = {}
    for a in assignments:
        n = a.placement.placement_node_rank
        counts[n] = counts.get(n, 0) + 1
    return [counts[n] for n in sorted(counts)]


class PlacectlResourcePoolManager(ResourcePoolManager):
    """verl's ``ResourcePoolManager`` whose pools are components of a reservation, for
    trainers such as ``RayPPOTrainer`` (with ``ray_worker_group_cls=PlacectlWorkerGroup``).

    verl starts one process per rank and pool, hosting every role mapped to the pool, so
    a pool is one placectl component: ``actor_rollout_ref: all`` in the configuration,
    ``pools={"global_pool": "actor_rollout_ref"}`` here. It checks no free GPUs: the
    reservation holds them.

    Args:
        reservation: a :class:`clients.Reservation`.
        pools: verl pool name -> the component whose ranks it holds.
        mapping: verl role -> pool name, as for verl's own manager.
        max_colocate_count: how many worker groups share each pool's ranks (verl's
            manager's own default when not given).

    Raises:
        PlacementError: a pool names no component of the reservation, or a role maps to
            no pool.
    """

    def __init__(
        self,
        reservation: Any,
        pools: Mapping[str, str],
        mapping: Mapping,
        max_colocate_count: int | None = None,
    ) -> None:
        known = set(reservation.components)
        for pool, component in pools.items():
            if component not in known:
                raise PlacementError(
                    f"pool {pool!r}: no component {component!r} in reservation "
                    f"{reservation.job!r} (components: {', '.join(sorted(known))})"
                )
        for role, pool in mapping.items():
            if pool not in pools:
                raise PlacementError(
                    f"role {role} maps to pool {pool!r}, which is not one of the pools "
                    f"({', '.join(sorted(pools))})"
                )
        super().__init__(
            resource_pool_spec={
                name: _process_on_nodes(reservation.assignments(component))
                for name, component in pools.items()
            },
            mapping=dict(mapping),
            **({} if max_colocate_count is None else {"max_colocate_count": max_colocate_count}),
        )
        check_colocate_count(self.max_colocate_count)
        self.reservation = reservation
        self.pools = dict(pools)

    def create_resource_pool(self) -> None:
        for name, component in self.pools.items():
            self.resource_pool_dict[name] = PlacectlResourcePool(
                self.reservation,
                component,
                name_prefix=name,
                max_colocate_count=self.max_colocate_count,
            )


# verl's classes are imported here, once, with the error that says how to install verl.
__all__ = [
    "VERL_MAX_COLOCATE_COUNT",
    "VERL_VERSION",
    "PlacectlResourcePool",
    "PlacectlResourcePoolManager",
    "RayClassWithInitArgs",
    "RayWorkerGroup",
    "check_colocate_count",
    "create_colocated_worker_cls",
]
