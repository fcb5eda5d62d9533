"""Worker groups: one actor per rank of a component, each in its bundle, with its env."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import ray

from controller import PlacementError
from controller.environment import PROTECTED
from controller.reservations import Assignment

WORKER_NAMESPACE = "placectl-workers"
# Options that decide where and with what a worker runs: the assignment owns them.
_PLACEMENT_OPTIONS = frozenset(
    {"num_gpus", "num_cpus", "resources", "scheduling_strategy", "placement_group"}
)


def worker_name(job: str, component: str, rank: int) -> str:
    """The name of a detached worker (namespace ``placectl-workers``)."""
    return f"{job}.{component}.{rank}"


def _check_env(env: dict[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise PlacementError(f"env {env!r}: expected a dict of strings to strings")
    clash = sorted(set(env) & PROTECTED)
    if clash:
        raise PlacementError(
            f"env sets {', '.join(clash)}, which placectl owns and sets for every worker; "
            "remove it (or choose the placement in the configuration instead)"
        )
    return dict(env)


def options_for(
    assignment: Assignment,
    controller_name: str,
    env: dict[str, str] | None = None,
    actor_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``Actor.options`` for one rank: the assignment's, the user's env and options merged.

    Raises:
        PlacementError: ``env`` sets a key placectl owns, or ``actor_options`` sets one of
            the placement options (num_gpus, num_cpus, resources, scheduling_strategy).
    """
    options = assignment.actor_options()
    extra = dict(actor_options or {})
    clash = sorted(set(extra) & _PLACEMENT_OPTIONS)
    if clash:
        raise PlacementError(
            f"actor_options sets {', '.join(clash)}, which the reservation decides; "
            "change the configuration instead"
        )
    runtime_env = dict(extra.pop("runtime_env", None) or {})
    user_env = _check_env({**runtime_env.pop("env_vars", {}), **_check_env(env)})
    merged = {**runtime_env, **options["runtime_env"]}
    merged["env_vars"] = {
        **user_env,
        **options["runtime_env"]["env_vars"],
        "PLACECTL_CONTROLLER": controller_name,
    }
    options.update(extra)
    options["runtime_env"] = merged
    return options


class WorkerGroup:
    """The actors of one component, in rank order.

    Workers belong to the driver that launched them (or, with ``detached=True``, to no
    driver); the controller never kills them. ``shutdown`` ends the workers and keeps the
    reservation, so the next launch schedules at once.
    """

    def __init__(
        self,
        reservation: Any,
        component: str,
        actors: list,
        assignments: list[Assignment],
        detached: bool = False,
        launch: tuple | None = None,
    ):
        self.reservation = reservation
        self.component = component
        self._actors = list(actors)
        self.detached = detached
        self._assignments = list(assignments)  # as launched: repair() compares against it
        self._launch = launch  # (actor class, args, kwargs, env, actor_options)

    @classmethod
    def launch(
        cls,
        reservation: Any,
        component: str,
        worker_cls: Any,
        *args: Any,
        env: dict[str, str] | None = None,
        actor_options: dict[str, Any] | None = None,
        detached: bool = False,
        **kwargs: Any,
    ) -> WorkerGroup:
        """Start one ``worker_cls`` actor per rank of ``component`` in its bundle.

        Args:
            reservation: a :class:`clients.Reservation`.
            component: the component to launch.
            worker_cls: a class, or a ``ray.remote`` actor class.
            *args, **kwargs: constructor arguments, the same for every rank.
            env: extra environment variables (placectl's own keys are refused).
            actor_options: further ``.options()`` (e.g. ``max_concurrency``); placement
                options are the reservation's and are refused.
            detached: name the workers after job/component/rank and detach them, so a
                restarted driver finds them with :meth:`attach`.
        """
        assignments = reservation.assignments(component)
        actor_cls = worker_cls if hasattr(worker_cls, "options") else ray.remote(worker_cls)
        name = reservation.controller.name
        all_options = [options_for(a, name, env, actor_options) for a in assignments]
        if detached:
            for a, options in zip(assignments, all_options, strict=True):
                options.update(
                    name=worker_name(reservation.job, component, a.placement.rank),
                    namespace=WORKER_NAMESPACE,
                    lifetime="detached",
                )
        actors = [actor_cls.options(**o).remote(*args, **kwargs) for o in all_options]
        launch = (actor_cls, args, kwargs, env, actor_options)
        return cls(reservation, component, actors, assignments, detached, launch)

    @classmethod
    def attach(cls, reservation: Any, component: str) -> WorkerGroup:
        """Find the running detached workers of ``component`` (launched with
        ``detached=True``), e.g. from a restarted driver."""
        actors = []
        assignments = reservation.assignments(component)
        for a in assignments:
            name = worker_name(reservation.job, component, a.placement.rank)
            try:
                actors.append(ray.get_actor(name, namespace=WORKER_NAMESPACE))
            except ValueError:
                raise PlacementError(
                    f"no running worker {name!r} (namespace {WORKER_NAMESPACE!r}); launch "
                    "the group with detached=True first"
                ) from None
        return cls(reservation, component, actors, assignments, detached=True)

    @property
    def actors(self) -> list:
        """Actor handles in rank order."""
        return list(self._actors)

    def __len__(self) -> int:
        return len(self._actors)

    def execute_async(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method`` on every rank; ObjectRefs in rank order."""
        return [getattr(a, method).remote(*args, **kwargs) for a in self._actors]

    def execute(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method`` on every rank and wait; results in rank order."""
        return ray.get(self.execute_async(method, *args, **kwargs))

    def execute_rank(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on one rank and wait for its result."""
        if not 0 <= rank < len(self._actors):
            raise PlacementError(f"rank {rank}: out of range (0-{len(self._actors) - 1})")
        return ray.get(getattr(self._actors[rank], method).remote(*args, **kwargs))

    def repair(self, timeout: float = 120.0) -> list[int]:
        """After a slot was replaced, relaunch exactly the ranks whose node changed.

        Waits until the reservation is ready again, then starts each lost rank in its new
        bundle with its new environment (a new MASTER_ADDR/PORT if rank 0 moved; the
        surviving ranks keep running and must re-read theirs when they rejoin).

        Returns:
            The relaunched ranks (empty when nothing moved).

        Raises:
            ReservationTimeout: the reservation is not ready within ``timeout``.
            PlacementError: the group was attached rather than launched here, so its
                constructor arguments are unknown.
        """
        if self._launch is None:
            raise PlacementError(
                "repair() needs the group's constructor arguments: relaunch it with "
                "WorkerGroup.launch instead of attach"
            )
        self.reservation.wait_ready(timeout)
        fresh = self.reservation.assignments(self.component)
        lost = [
            r
            for r, (old, new) in enumerate(zip(self._assignments, fresh, strict=True))
            if old.placement.node_id != new.placement.node_id
            or old.placement_group_id != new.placement_group_id
        ]
        actor_cls, args, kwargs, env, actor_options = self._launch
        name = self.reservation.controller.name
        for r in lost:
            with contextlib.suppress(Exception):  # most are already dead with their node
                ray.kill(self._actors[r], no_restart=True)
            options = options_for(fresh[r], name, env, actor_options)
            if self.detached:
                options.update(
                    name=worker_name(self.reservation.job, self.component, r),
                    namespace=WORKER_NAMESPACE,
                    lifetime="detached",
                )
            self._actors[r] = actor_cls.options(**options).remote(*args, **kwargs)
        self._assignments = fresh
        return lost

    def shutdown(self) -> None:
        """Kill every worker; the reservation stays."""
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []


_CURRENT: dict[tuple[str, str, int, str], Assignment] = {}


def current() -> Assignment:
    """Inside a worker placectl placed: its own :class:`Assignment`.

    Raises:
        PlacementError: the process was not placed by placectl.
    """
    env = os.environ
    missing = [k for k in ("PLACECTL_JOB", "PLACECTL_COMPONENT", "RANK") if k not in env]
    if missing:
        raise PlacementError(
            f"not a placectl worker: {', '.join(missing)} not set in the environment"
        )
    key = (
        env["PLACECTL_JOB"],
        env["PLACECTL_COMPONENT"],
        int(env["RANK"]),
        env.get("PLACECTL_CONTROLLER", "placectl"),
    )
    if key not in _CURRENT:
        from clients.session import connect

        job, component, rank, name = key
        res = connect(start=False, name=name).reservation(job)
        _CURRENT[key] = res.assignments(component)[rank]
    return _CURRENT[key]
