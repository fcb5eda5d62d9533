"""OpenRLHF on placectl: its actor groups and vLLM engines in a placectl reservation.

Written against openrlhf 0.11.2 (``OPENRLHF_VERSION``); imported only when used, and
openrlhf is not a dependency of placectl. OpenRLHF's launcher creates its own placement
groups (one per colocated set, ``PACK``, of ``{"GPU": 1, "CPU": 1}`` bundles) and puts
training rank ``r`` in bundle ``r`` as Ray numbered them: it neither probes nor sorts
them. Its vLLM engines take bundles from one shared group: engine ``i`` the ``i``-th
bundle, or with tensor parallelism the ``i``-th run of ``tensor_parallel_size`` bundles
after grouping the group's bundles by node. Nothing of this survives the driver.

Two calls change; the actor classes, ``async_run_method*``, batch dispatch by
``duplicate_actors`` and the engines' methods stay OpenRLHF's::

    res = clients.connect().reserve("ppo", conf)  # e.g. {"actor,ref": "0-7",
                                                  #  "rollout": {"placement": "0-7:0-3",
                                                  #              "engine": "vllm"}}
    actor = ReservedActorGroup(res, "actor", PolicyModelActor, duplicate_actors=tp)
    engines = create_vllm_engines(res, "rollout", pretrain, seed, False, True, True, 4096)

Rank ``r`` starts in placectl's bundle for rank ``r`` with its share of the GPU (colocated
components split it as the configuration says, instead of OpenRLHF's fixed 0.2), and
every rank gets the component's master address and the port placectl leased for it
(OpenRLHF's rank 0 would pick one with ``bind(("", 0))``). A training component whose
processes hold several GPUs, none, or see every GPU of the node (``isolate: false``) is
refused: OpenRLHF would take ``LOCAL_RANK`` from the physical GPU id there
(:mod:`clients.integrations.openrlhf_layout`).

Failures: OpenRLHF's actors belong to the driver. After a driver restart, or a node
loss once the reservation is repaired (``res.wait_ready()``), the driver creates its
groups and engines again; they start in the kept reservation (the spare node's bundles
for the lost slot). A driver that stays up calls :meth:`ReservedActorGroup.shutdown`
on the old group first, so its surviving actors give their shares back.

What this module relies on in OpenRLHF, and what breaks if OpenRLHF changes it:

* ``RayActorGroup.__init__(num_nodes, num_gpus_per_node, ray_actor_type, pg,
  num_gpus_per_actor, duplicate_actors)`` calls ``self._initiate_actors(pg,
  num_gpus_per_actor)``, which must fill ``self._actor_handlers`` in rank order; the
  ``async_*`` methods and ``duplicate_actors`` are used as they are;
* ``BaseDistributedActor(world_size, rank, master_addr, master_port)`` sets
  ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` from
  them and from ``ray_noset_visible_devices()``;
* ``vllm_engine.create_vllm_engines`` looks up the module globals ``RolloutRayActor``
  and ``get_bundle_indices`` when called, starts engine ``i`` with
  ``RolloutRayActor.options(...).remote(**kwargs)`` in order, creates no placement group
  when given ``shared_pg``, and passes ``bundle_indices`` and ``num_gpus`` in the kwargs,
  which ``RolloutRayActor`` turns into ``VLLM_RAY_BUNDLE_INDICES`` and
  ``VLLM_RAY_PER_WORKER_GPUS`` for vLLM's Ray executor.
"""

from __future__ import annotations

import threading
from typing import Any

from clients.integrations import warn_if_not
from clients.integrations.openrlhf_layout import engine_layout, training_layout
from clients.launching import options_for
from controller.errors import PlacementError
from controller.state.assignments import Assignment

OPENRLHF_VERSION = "0.11.2"

try:
    import ray
    from openrlhf.trainer.ray import vllm_engine
    from openrlhf.trainer.ray.launcher import RayActorGroup
except ImportError as e:  # pragma: no cover - exercised only without openrlhf
    raise PlacementError(
        f"the OpenRLHF integration needs openrlhf {OPENRLHF_VERSION} and what its launcher "
        f"imports (vllm, deepspeed, flash_attn, transformers, peft): {e}"
    ) from None


warn_if_not("openrlhf", OPENRLHF_VERSION, "OpenRLHF")


def _master(component: str, assignments: list[Assignment]) -> tuple[str, int]:
    env = assignments[0].env
    if "MASTER_PORT" not in env:
        raise PlacementError(f"{component}: the reservation leased no master port for it")
    return env["MASTER_ADDR"], int(env["MASTER_PORT"])


class ReservedActorGroup(RayActorGroup):
    """OpenRLHF's ``RayActorGroup`` whose rank ``r`` runs in placectl's bundle for rank
    ``r`` of ``component``, with its share, its devices and the component's leased master
    address and port.

    Args:
        reservation: a ready :class:`clients.Reservation`.
        component: the component of the reservation the group runs.
        ray_actor_type: OpenRLHF's actor class (``PolicyModelActor``, ...: a
            ``@ray.remote`` subclass of ``BaseModelActor``).
        duplicate_actors: actors that receive the same batch chunk
            (``ring_attn_size * tensor_parallel_size``), as in OpenRLHF.
        env: extra variables for every actor (placectl's own keys are refused).
        actor_options: extra ``.options()`` (not the placement ones).

    Raises:
        PlacementError: the component does not suit OpenRLHF's training actors (see
            :func:`~clients.integrations.openrlhf_layout.training_layout`), or the
            reservation is not ready.
    """

    def __init__(
        self,
        reservation: Any,
        component: str,
        ray_actor_type: Any,
        duplicate_actors: int = 1,
        env: dict[str, str] | None = None,
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        assignments = reservation.assignments(component)
        num_nodes, per_node = training_layout(component, assignments, duplicate_actors)
        self.reservation = reservation
        self.component = component
        self.assignments = assignments
        self._env = env
        self._extra = actor_options
        super().__init__(
            num_nodes,
            per_node,
            ray_actor_type,
            pg=None,
            num_gpus_per_actor=assignments[0].num_gpus,
            duplicate_actors=duplicate_actors,
        )

    def _initiate_actors(self, pg: Any, num_gpus_per_actor: float) -> None:
        addr, port = _master(self.component, self.assignments)
        world = len(self.assignments)
        self._actor_handlers = [
            self.ray_actor_type.options(**options_for(a, self._env, self._extra)).remote(
                world, a.placement.rank, addr, port
            )
            for a in self.assignments
        ]

    def shutdown(self) -> None:
        """Kill the group's actors, giving their shares of the bundles back."""
        for actor in self._actor_handlers:
            ray.kill(actor, no_restart=True)
        self._actor_handlers = []


class _NoGroup:
    """Stands in for OpenRLHF's ``shared_pg``: tells it to create no placement group.
    Every scheduling strategy built on it is replaced before an actor starts."""


class _Engines:
    """Stands in for ``RolloutRayActor`` and ``get_bundle_indices`` while OpenRLHF's
    ``create_vllm_engines`` runs: engine ``i`` starts as assignment ``i`` says."""

    def __init__(self, engine_cls: Any, assignments: list[Assignment], tp: int, env: Any) -> None:
        self.engine_cls = engine_cls
        self.assignments = assignments
        self.tp = tp
        self.env = env
        self.started: list[Any] = []

    def bundle_indices(self, _pg: Any, index: int, length: int) -> list[int]:
        return list(self.assignments[index].bundle_indices)

    def options(self, **_openrlhf_options: Any) -> _Engines:
        return self

    def remote(self, **kwargs: Any) -> Any:
        a = self.assignments[len(self.started)]
        if self.tp > 1:
            kwargs["bundle_indices"] = list(a.bundle_indices)
            kwargs["num_gpus"] = a.child_share
        options = options_for(a, self.env)
        engine = self.engine_cls.options(**options).remote(**kwargs)
        self.started.append(engine)
        return engine


_SWAP = threading.Lock()


def create_vllm_engines(
    reservation: Any,
    component: str,
    pretrain: str,
    seed: int,
    full_determinism: bool,
    enable_prefix_caching: bool,
    enforce_eager: bool,
    max_model_len: int,
    gpu_memory_utilization: float | None = None,
    vllm_enable_sleep: bool = False,
    logprobs_mode: str | None = None,
    *,
    engine_cls: Any = None,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """OpenRLHF's ``create_vllm_engines``, one engine per process of ``component``.

    The number of engines and ``tensor_parallel_size`` come from the reservation (the
    component's processes, and the accelerators each holds), so OpenRLHF's
    ``num_engines``, ``tensor_parallel_size`` and ``shared_pg`` are not parameters; the
    others are OpenRLHF's, in its order, and ``kwargs`` (``agent_func_path``, ...) go to
    it unchanged. Engine ``i`` starts in the bundle of its first accelerator with its
    placectl share and its children's bundles in ``VLLM_RAY_BUNDLE_INDICES``.

    Args:
        engine_cls: the engine actor class (default OpenRLHF's ``RolloutRayActor``).
        env: extra variables for every engine.

    Raises:
        PlacementError: the component does not suit vLLM engines (see
            :func:`~clients.integrations.openrlhf_layout.engine_layout`), or ``kwargs``
            names one of the parameters the reservation decides.
    """
    decided = sorted({"num_engines", "tensor_parallel_size", "shared_pg"} & set(kwargs))
    if decided:
        raise PlacementError(
            f"create_vllm_engines: {', '.join(decided)} come(s) from reservation "
            f"{reservation.job!r}; change its configuration instead"
        )
    assignments = reservation.assignments(component)
    tp = engine_layout(component, assignments)
    starter = _Engines(engine_cls or vllm_engine.RolloutRayActor, assignments, tp, env)
    with _SWAP:
        saved = vllm_engine.RolloutRayActor, vllm_engine.get_bundle_indices
        vllm_engine.RolloutRayActor = starter
        vllm_engine.get_bundle_indices = starter.bundle_indices
        try:
            engines = vllm_engine.create_vllm_engines(
                len(assignments),
                tp,
                pretrain,
                seed,
                full_determinism,
                enable_prefix_caching,
                enforce_eager,
                max_model_len,
                shared_pg=_NoGroup(),
                gpu_memory_utilization=gpu_memory_utilization,
                vllm_enable_sleep=vllm_enable_sleep,
                logprobs_mode=logprobs_mode,
                **kwargs,
            )
        finally:
            vllm_engine.RolloutRayActor, vllm_engine.get_bundle_indices = saved
    if len(starter.started) != len(assignments):
        raise PlacementError(
            f"OpenRLHF started {len(starter.started)} engines for {len(assignments)} "
            f"processes of {component}; see the module docstring for what changed"
        )
    return engines


__all__ = ["OPENRLHF_VERSION", "ReservedActorGroup", "create_vllm_engines"]
