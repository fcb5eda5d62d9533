"""verl on placectl: verl worker groups whose rank r runs where placectl placed rank r.

Written against verl 0.9.1 (``VERL_VERSION``); imported only when used, and verl is not a
dependency of placectl. Everything verl offers on a worker group keeps working: its
``Worker`` base class and environment, ``@register`` dispatch modes,
``execute_all_sync``, colocation through ``create_colocated_worker_cls`` and
``spawn``, ``from_detached``. What changes is where and how each worker starts: in its
placectl bundle, with its placectl share and devices, and the master address and port
placectl leased, instead of verl's own placement groups (ordered by IP as a string) and
a port picked with ``bind(("", 0))``.

What this module relies on in verl, and what breaks if verl changes it:

* ``RayWorkerGroup._init_with_resource_pool`` is the hook overridden to start the
  workers, and ``_workers``, ``_worker_names``, ``_world_size``, ``_master_addr``,
  ``_master_port``, ``name_prefix`` the state it fills in;
* ``RayClassWithInitArgs.cls``, ``.args``, ``.kwargs``, ``._options`` are read to start
  a worker (its ``__call__``, which chooses a bundle itself, is not used);
* verl's ``Worker`` reads ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``WG_PREFIX``, ``WG_BACKEND``,
  ``RAY_LOCAL_WORLD_SIZE``, and treats a true ``RAY_EXPERIMENTAL_NOSET_*`` as "every GPU
  of the node is visible" (placectl leaves it empty for the single-GPU processes verl
  uses, so verl takes ``LOCAL_RANK`` from the environment: 0).

Trainers built on ``ResourcePoolManager`` (``RayPPOTrainer``) take a
:class:`PlacectlResourcePoolManager` and ``ray_worker_group_cls=PlacectlWorkerGroup``;
verl's own ``RayWorkerGroup`` would ignore the placement, so a placectl pool refuses to
hand it placement groups.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import msgspec
import ray

from clients.integrations.verl_pools import (  # verl's classes, or how to install verl
    VERL_MAX_COLOCATE_COUNT,
    VERL_VERSION,
    PlacectlResourcePool,
    PlacectlResourcePoolManager,
    RayClassWithInitArgs,
    RayWorkerGroup,
    create_colocated_worker_cls,
)
from clients.integrations.verl_repair import VerlStandbys
from clients.launching import WORKER_NAMESPACE, detached_worker, options_for
from clients.standby import Standbys, standby_name
from controller.errors import PlacementError
from controller.state.assignments import Assignment


def _named(name: str) -> Any:
    """The running worker ``name``: a placectl detached worker, else verl's own."""
    try:
        return detached_worker(name, "verl worker")
    except PlacementError:
        return ray.get_actor(name)


def _verl_env(a: Assignment, prefix: str) -> dict[str, str]:
    """The variables verl's RayWorkerGroup gives each worker, with placectl's values."""
    return {
        "WG_PREFIX": prefix,
        "WG_BACKEND": "ray",
        "RAY_LOCAL_WORLD_SIZE": a.env["NODE_LOCAL_WORLD_SIZE"],
    }


class PlacectlWorkerGroup(VerlStandbys, RayWorkerGroup):
    """verl's ``RayWorkerGroup``, started on a :class:`PlacectlResourcePool`: rank r in
    placectl's rank r's bundle, with its share, devices and environment, repaired with
    :meth:`repair`. On any other pool it behaves exactly as verl's own class."""

    def _init_with_resource_pool(
        self, resource_pool, ray_cls_with_init, bin_pack, detached, worker_env=None
    ):
        if not isinstance(resource_pool, PlacectlResourcePool):
            return super()._init_with_resource_pool(
                resource_pool, ray_cls_with_init, bin_pack, detached, worker_env
            )
        resource_pool.take(self.name_prefix)  # before anything starts: a full pool refuses
        self.resource_pool = resource_pool
        assignments = resource_pool.assignments
        self._world_size, first = len(assignments), assignments[0].env
        self._master_addr, self._master_port = first["MASTER_ADDR"], first.get("MASTER_PORT")
        self.bind_launch(ray_cls_with_init, detached or resource_pool.detached, worker_env)
        for a in assignments:
            name = self.verl_name(a)
            self._workers.append(self._start_worker(a, name, {}))
            self._worker_names.append(name)
        self.refill_standbys()

    def _init_with_detached_workers(self, worker_names, worker_handles):
        # verl's from_detached looks names up in the caller's namespace; placectl's
        # detached workers live in its workers' own (found from any driver): there
        # first, then verl's place
        if not worker_handles and worker_names:
            worker_handles = [_named(name) for name in worker_names]
        super()._init_with_detached_workers(worker_names, worker_handles)

    def bind_launch(self, ray_cls_with_init, detached: bool, worker_env=None) -> None:
        """How this group starts a worker (set by :func:`worker_group` and :func:`attach`):
        verl's class with its arguments, detached or not, the workers' extra env."""
        cls_name = getattr(ray_cls_with_init.cls, "__ray_metadata__", None)
        self._placectl_cls_name = cls_name.class_name if cls_name is not None else "Worker"
        self._placectl_cls = ray_cls_with_init
        self._placectl_detached = detached
        self._placectl_env = dict(worker_env or {})
        self._placectl_standbys = Standbys()

    def verl_name(self, a: Assignment) -> str:
        """The name verl gives the worker of ``a``'s rank."""
        p = a.placement
        return f"{self.name_prefix}{self._placectl_cls_name}_{p.placement_node_rank}:{p.local_rank}"

    def _options(self, a: Assignment) -> dict[str, Any]:
        extra = dict(getattr(self._placectl_cls, "_options", {}) or {})
        extra.pop("name", None)
        # this group's part of the rank's share (the pool's max_colocate_count)
        options = options_for(self.resource_pool.worker_assignment(a), self._placectl_env, extra)
        options["runtime_env"]["env_vars"].update(_verl_env(a, self.name_prefix))
        return options

    def _env_of(self, a: Assignment) -> dict[str, str]:
        return self._options(a)["runtime_env"]["env_vars"]

    def _start_worker(self, a: Assignment, name: str, identity: dict[str, str]) -> Any:
        """One verl worker in ``a``'s bundle, named ``name``; ``identity`` overrides the
        rank's (a standby's placeholder, :mod:`clients.integrations.verl_repair`)."""
        options = self._options(a)
        options["runtime_env"]["env_vars"].update(identity)
        options["name"] = name
        if self._placectl_detached or identity:  # a standby is named: status finds it
            options.update(namespace=WORKER_NAMESPACE)
        if self._placectl_detached:
            options.update(lifetime="detached")
        cls = self._placectl_cls
        return cls.cls.options(**options).remote(*cls.args, **cls.kwargs)


def resource_pool(
    reservation: Any,
    component: str,
    name_prefix: str | None = None,
    detached: bool = False,
    max_colocate_count: int = VERL_MAX_COLOCATE_COUNT,
) -> PlacectlResourcePool:
    """A verl resource pool of ``component``'s ranks, for trainer code built on verl's
    pools (with ``ray_worker_group_cls=PlacectlWorkerGroup``): up to
    ``max_colocate_count`` worker groups share it, each worker asking that fraction of
    its rank's share, as on verl's ``RayResourcePool`` (whose default it takes)."""
    return PlacectlResourcePool(
        reservation,
        component,
        name_prefix=name_prefix,
        detached=detached,
        max_colocate_count=max_colocate_count,
    )


def worker_group(
    reservation: Any,
    component: str,
    ray_cls_with_init: RayClassWithInitArgs,
    *,
    name_prefix: str | None = None,
    detached: bool = False,
    **kwargs: Any,
) -> PlacectlWorkerGroup:
    """A verl worker group of ``component``: verl's rank r runs in placectl's rank r.

    Args:
        reservation: a :class:`clients.Reservation`.
        component: the component to start.
        ray_cls_with_init: verl's ``RayClassWithInitArgs`` of a ``ray.remote`` verl
            ``Worker`` subclass (or of ``create_colocated_worker_cls(...)``).
        name_prefix: verl's worker name prefix (default ``<job>.<component>.``).
        detached: start the workers detached, re-attachable with :func:`attach`.
        **kwargs: passed to verl's ``RayWorkerGroup`` (``worker_env``, ...).
    """
    pool = PlacectlResourcePool(
        reservation, component, name_prefix=name_prefix, detached=detached, max_colocate_count=1
    )  # its own pool: the group holds each rank's whole share
    return PlacectlWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=ray_cls_with_init,
        name_prefix=pool.name_prefix,
        detached=detached,
        **kwargs,
    )


def colocated_worker_group(
    reservation: Any,
    roles: Mapping[str, RayClassWithInitArgs],
    *,
    name_prefix: str | None = None,
    detached: bool = False,
    **kwargs: Any,
) -> PlacectlWorkerGroup:
    """One verl worker group hosting several colocated roles in one process per rank,
    through verl's ``create_colocated_worker_cls``; split it with ``.spawn(roles)``.

    The roles are components of the reservation placed on the same devices rank by
    rank (``actor,rollout,ref: all``); each process asks for the sum of their shares, so
    placectl's accounting of the accelerator still holds.

    Raises:
        PlacementError: a role that is not a component, or roles placed differently.
    """
    names = list(roles)
    if not names:
        raise PlacementError("colocated_worker_group needs at least one role")
    per_role = {n: reservation.assignments(n) for n in names}
    first = per_role[names[0]]
    for n in names[1:]:
        mine = per_role[n]
        same = len(mine) == len(first) and all(
            (a.placement.node_id, a.placement.cuda_visible_devices)
            == (b.placement.node_id, b.placement.cuda_visible_devices)
            for a, b in zip(first, mine, strict=True)
        )
        if not same:
            raise PlacementError(
                f"roles {names[0]!r} and {n!r} are not placed on the same devices rank by "
                "rank; colocate them under one key (e.g. 'actor,rollout,ref: all')"
            )
    fused_assignments = [
        msgspec.structs.replace(
            a,
            num_gpus=round(sum(per_role[n][r].num_gpus for n in names), 4),
            num_cpus=round(sum(per_role[n][r].num_cpus for n in names), 4),
        )
        for r, a in enumerate(first)
    ]
    pool = PlacectlResourcePool(
        reservation,
        names[0],
        assignments=fused_assignments,
        name_prefix=name_prefix or f"{reservation.job}.{'+'.join(names)}.",
        detached=detached,
        max_colocate_count=1,
    )
    pool.fused = True
    return PlacectlWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=create_colocated_worker_cls(dict(roles)),
        name_prefix=pool.name_prefix,
        detached=detached,
        **kwargs,
    )


def attach(
    reservation: Any,
    component: str,
    ray_cls_with_init: RayClassWithInitArgs,
    *,
    name_prefix: str | None = None,
    max_colocate_count: int = 1,
) -> PlacectlWorkerGroup:
    """The running detached verl workers of ``component`` (started with
    ``detached=True``), from a restarted driver, as a verl worker group; a worker it
    starts again asks what the group's own did (``max_colocate_count``: that of the pool
    the group was made on; :func:`worker_group`'s is 1).

    Raises:
        PlacementError: a worker is not running.
    """
    prefix = name_prefix or f"{reservation.job}.{component}."
    cls_name = getattr(ray_cls_with_init.cls, "__ray_metadata__", None)
    cls_name = cls_name.class_name if cls_name is not None else "Worker"
    names, handles = [], []
    for a in reservation.assignments(component):
        name = f"{prefix}{cls_name}_{a.placement.placement_node_rank}:{a.placement.local_rank}"
        with contextlib.suppress(PlacementError):  # a standby promoted to the rank
            promoted = standby_name(reservation.job, component, a)
            handles.append(detached_worker(promoted, "verl worker"))
            names.append(promoted)
            continue
        handles.append(detached_worker(name, "verl worker"))
        names.append(name)
    group = PlacectlWorkerGroup.from_detached(
        name_prefix=prefix,
        worker_names=names,
        worker_handles=handles,
        ray_cls_with_init=ray_cls_with_init,
    )
    group.resource_pool = PlacectlResourcePool(
        reservation,
        component,
        name_prefix=prefix,
        detached=True,
        max_colocate_count=max_colocate_count,
    )
    group.bind_launch(ray_cls_with_init, True)
    return group


__all__ = [
    "VERL_VERSION",
    "PlacectlResourcePool",
    "PlacectlResourcePoolManager",
    "PlacectlWorkerGroup",
    "attach",
    "colocated_worker_group",
    "resource_pool",
    "worker_group",
]
