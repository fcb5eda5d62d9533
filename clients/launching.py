"""How one worker of a group starts: its name, its Ray options and environment from its
assignment, its per-rank arguments, and the wait until the workers of a group are up."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from controller import PlacementError
from controller.errors import ReservationTimeout
from controller.state.assignments import Assignment
from controller.state.environment import check_user_env

WORKER_NAMESPACE = "placectl-workers"
PROGRESS_PERIOD_S = 5.0
# Options that decide where and with what a worker runs: the assignment owns them.
_PLACEMENT_OPTIONS = frozenset(
    {"num_gpus", "num_cpus", "resources", "scheduling_strategy", "placement_group"}
)
RankKwargs = Sequence[dict[str, Any]] | Callable[[int], dict[str, Any]] | None


def worker_name(job: str, component: str, rank: int) -> str:
    """The name of a detached worker (namespace ``placectl-workers``)."""
    return f"{job}.{component}.{rank}"


def detached_worker(name: str, kind: str = "worker") -> Any:
    """The running detached worker ``name``; PlacementError when there is none."""
    try:
        return ray.get_actor(name, namespace=WORKER_NAMESPACE)
    except ValueError:
        raise PlacementError(
            f"no running {kind} {name!r} (namespace {WORKER_NAMESPACE!r}); start the group "
            "with detached=True first"
        ) from None


def actor_class(worker_cls: Any) -> Any:
    return worker_cls if hasattr(worker_cls, "options") else ray.remote(worker_cls)


def _check_env(env: dict[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise PlacementError(f"env {env!r}: expected a dict of strings to strings")
    check_user_env(env, "env")
    return dict(env)


def options_for(
    assignment: Assignment,
    env: dict[str, str] | None = None,
    actor_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``Actor.options`` for one rank: the assignment's own (:meth:`Assignment.actor_options`,
    the one path from an assignment to Ray's options), the user's env and options merged.

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
    merged["env_vars"] = {**user_env, **options["runtime_env"]["env_vars"]}
    options.update(extra)
    options["runtime_env"] = merged
    return options


def rank_kwargs_for(rank_kwargs: RankKwargs, world: int) -> list[dict[str, Any]]:
    if rank_kwargs is None:
        return [{} for _ in range(world)]
    if callable(rank_kwargs):
        out = [rank_kwargs(r) for r in range(world)]
    else:
        out = list(rank_kwargs)
        if len(out) != world:
            raise PlacementError(
                f"rank_kwargs has {len(out)} entries; the component has {world} ranks"
            )
    if not all(isinstance(k, dict) for k in out):
        raise PlacementError("rank_kwargs: expected one dict of keyword arguments per rank")
    return out


def wait_until_ready(
    actors: list, label: str, timeout: float, progress: Callable[[str], None] | None = None
) -> None:
    """Wait until every actor has started (its constructor returned), printing what is
    still pending every few seconds.

    Raises:
        ReservationTimeout: some did not start in time (they are killed).
        ray.exceptions.RayActorError: a constructor failed (the error names the rank).
    """
    say = progress or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True))
    refs = {a.__ray_ready__.remote(): r for r, a in enumerate(actors)}
    pending = dict(refs)
    deadline = time.monotonic() + timeout
    next_say = time.monotonic() + PROGRESS_PERIOD_S
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            ranks = sorted(pending.values())
            for a in actors:
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)
            raise ReservationTimeout(
                f"{label}: ranks {ranks} did not start within {timeout:g}s; every worker of "
                "the group was killed"
            )
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=min(1.0, left))
        for ref in done:
            rank = pending.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                raise PlacementError(f"{label}: rank {rank} failed to start: {e}") from e
        if pending and time.monotonic() >= next_say:
            ranks = sorted(pending.values())
            shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
            say(
                f"{label}: {len(actors) - len(pending)} of {len(actors)} workers ready; "
                f"waiting for ranks {shown}"
            )
            next_say = time.monotonic() + PROGRESS_PERIOD_S
