"""Worker groups: one actor per rank of a component, each in its bundle, with its env."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import ray

from clients import verdict
from clients.sync import SyncResult, can_keep, plan_sync
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


def _actor_class(worker_cls: Any) -> Any:
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


def _rank_kwargs(rank_kwargs: RankKwargs, world: int) -> list[dict[str, Any]]:
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
        self._launch = launch  # (actor class, args, kwargs, env, actor_options, rank kwargs)

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
        rank_kwargs: RankKwargs = None,
        wait: bool = True,
        timeout: float = 300.0,
        progress: Callable[[str], None] | None = None,
        **kwargs: Any,
    ) -> WorkerGroup:
        """Start one ``worker_cls`` actor per rank of ``component`` in its bundle, once
        the reservation is ready (waiting for a repair in progress, within ``timeout``).

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
            rank_kwargs: per-rank keyword arguments, a list (one dict per rank) or a
                function of the rank; merged over ``kwargs``.
            wait: wait until every worker's constructor has returned (default), with
                progress on stderr every few seconds.
            timeout: how long to wait; then every worker is killed and
                :class:`ReservationTimeout` raised.
            progress: where progress goes (default stderr).
        """
        reservation.wait_ready(timeout, progress=progress)
        assignments = reservation.assignments(component)
        actor_cls = _actor_class(worker_cls)
        per_rank = _rank_kwargs(rank_kwargs, len(assignments))
        actors = [
            cls._start(
                reservation,
                component,
                actor_cls,
                a,
                args,
                {**kwargs, **extra},
                env,
                actor_options,
                detached,
            )
            for a, extra in zip(assignments, per_rank, strict=True)
        ]
        launch = (actor_cls, args, kwargs, env, actor_options, rank_kwargs)
        group = cls(reservation, component, actors, assignments, detached, launch)
        if wait:
            wait_until_ready(actors, f"{reservation.job}/{component}", timeout, progress)
        return group

    @staticmethod
    def _start(reservation, component, actor_cls, a, args, kwargs, env, actor_options, detached):
        options = options_for(a, reservation.controller.name, env, actor_options)
        if detached:
            options.update(
                name=worker_name(reservation.job, component, a.placement.rank),
                namespace=WORKER_NAMESPACE,
                lifetime="detached",
            )
        return actor_cls.options(**options).remote(*args, **kwargs)

    @classmethod
    def attach(
        cls,
        reservation: Any,
        component: str,
        worker_cls: Any = None,
        *args: Any,
        env: dict[str, str] | None = None,
        actor_options: dict[str, Any] | None = None,
        rank_kwargs: RankKwargs = None,
        **kwargs: Any,
    ) -> WorkerGroup:
        """Find the running detached workers of ``component`` (launched with
        ``detached=True``), e.g. from a restarted driver.

        Args:
            worker_cls, *args, env, actor_options, rank_kwargs, **kwargs: what the group
                was launched with. With them the attached group can :meth:`repair` and
                :meth:`sync` like a launched one, and a rank whose worker is gone (its
                node was lost while no driver was running) is attached as missing, for
                ``repair()`` to start. Without them a missing worker is an error.

        Raises:
            PlacementError: a worker is missing and ``worker_cls`` was not given.
        """
        assignments = reservation.assignments(component, allow_degraded=True)
        actors = []
        for a in assignments:
            name = worker_name(reservation.job, component, a.placement.rank)
            try:
                actors.append(detached_worker(name))
            except PlacementError:
                if worker_cls is None:
                    raise
                actors.append(None)
        launch = None
        if worker_cls is not None:
            actor_cls = _actor_class(worker_cls)
            launch = (actor_cls, args, kwargs, env, actor_options, rank_kwargs)
        return cls(reservation, component, actors, assignments, detached=True, launch=launch)

    @property
    def actors(self) -> list:
        """Actor handles in rank order."""
        return list(self._actors)

    @property
    def assignments(self) -> list[Assignment]:
        """The assignments the running workers were started with, in rank order."""
        return list(self._assignments)

    def __len__(self) -> int:
        return len(self._actors)

    def execute_async(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method`` on every rank; ObjectRefs in rank order."""
        missing = [r for r, a in enumerate(self._actors) if a is None]
        if missing:
            raise PlacementError(
                f"{self.reservation.job}/{self.component}: ranks {missing} have no worker "
                "(they were lost while no driver ran); repair() starts them"
            )
        return [getattr(a, method).remote(*args, **kwargs) for a in self._actors]

    def execute(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call ``method`` on every rank and wait; results in rank order."""
        return ray.get(self.execute_async(method, *args, **kwargs))

    def execute_rank(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on one rank and wait for its result."""
        if not 0 <= rank < len(self._actors):
            raise PlacementError(f"rank {rank}: out of range (0-{len(self._actors) - 1})")
        return ray.get(getattr(self._actors[rank], method).remote(*args, **kwargs))

    def _stop(self, ranks: list[int]) -> None:
        """Kill ranks; a detached one's name is free again when this returns."""
        for r in ranks:
            with contextlib.suppress(Exception):  # most are already dead with their node
                ray.kill(self._actors[r], no_restart=True)
        if not self.detached:
            return
        deadline = time.monotonic() + 60
        for r in ranks:
            name = worker_name(self.reservation.job, self.component, r)
            while time.monotonic() < deadline:
                try:
                    ray.get_actor(name, namespace=WORKER_NAMESPACE)
                except ValueError:
                    break
                time.sleep(0.05)

    def _relaunch(self, ranks: list[int], fresh: list[Assignment]) -> None:
        """Start ``ranks`` anew in ``fresh`` (ranks past the group's end are added)."""
        actor_cls, args, kwargs, env, actor_options, rank_kwargs = self._launch
        per_rank = _rank_kwargs(rank_kwargs, len(fresh))
        self._stop([r for r in ranks if r < len(self._actors)])
        self._actors += [None] * (len(fresh) - len(self._actors))
        for r in ranks:
            self._actors[r] = self._start(
                self.reservation,
                self.component,
                actor_cls,
                fresh[r],
                args,
                {**kwargs, **per_rank[r]},
                env,
                actor_options,
                self.detached,
            )

    def dead_ranks(self) -> list[int]:
        """The ranks Ray reports dead now: their node is dead, or their actor is (a
        crash, an OOM kill), or they have no worker (attached while missing)."""
        nodes = self.reservation.controller.dead_nodes(
            a.placement.node_id for a in self._assignments
        )
        return [
            r
            for r, (a, actor) in enumerate(zip(self._assignments, self._actors, strict=True))
            if a.placement.node_id in nodes or actor is None or verdict.actor_dead(actor)
        ]

    def repair(
        self,
        timeout: float = 120.0,
        progress: Callable[[str], None] | None = None,
        hung_after: float | None = 10.0,
    ) -> list[int]:
        """Relaunch exactly the ranks that are gone, where the reservation now puts them.

        A rank whose worker does not answer is a suspect: its node may have died without
        a word (Ray still calls it alive), or it may be hung. ``repair`` first waits,
        at most ``hung_after`` seconds, for the verdict: the controller fences a node
        whose raylet refuses connections at once and one that stays silent after a few
        seconds, and Ray then reports its ranks dead. A suspect that answers again was
        only slow and is left alone; one still silent on a live node after
        ``hung_after`` seconds is hung and killed. A worker that is merely busy (a long
        step, a loop holding the GIL) answers and is never a suspect.

        Then it waits until the reservation is ready with none of its nodes dead, and
        relaunches every rank that is dead (:meth:`dead_ranks`) or whose bundle moved,
        each with its current environment (a new MASTER_ADDR/PORT if rank 0 moved; the
        surviving ranks keep running and read theirs again with ``clients.current()``
        when they rejoin), and waits until they have started. So a call the instant a
        node dies, abruptly or not, does what a call a minute later does.

        Args:
            timeout: for the whole repair.
            progress: where to say what it waits for (default stderr).
            hung_after: how long a silent rank on a live node may stay silent before it
                is killed as hung; ``None`` waits as long for Ray's verdict but kills
                nothing.

        Returns:
            The relaunched ranks (empty when none was gone or moved).

        Raises:
            ReservationTimeout: the reservation is not ready within ``timeout``.
            PlacementError: the group was attached without its launch arguments (its
                constructor is unknown), or its world size changed (use :meth:`sync`).
        """
        if self._launch is None:
            raise PlacementError(
                "repair() needs the group's constructor arguments: launch it with "
                "WorkerGroup.launch, or pass them to WorkerGroup.attach"
            )
        started = time.monotonic()
        res = self.reservation
        say = progress or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True))
        self._judge_suspects(min(hung_after or 10.0, timeout), hung_after is not None, say)
        res.wait_ready(max(timeout - (time.monotonic() - started), 1.0), progress=progress)
        fresh = res.assignments(self.component)
        if len(fresh) != len(self._assignments):
            raise PlacementError(
                f"{res.job}/{self.component} has {len(fresh)} ranks now, the group "
                f"{len(self._assignments)}: its configuration changed; sync() follows it"
            )
        pairs = enumerate(zip(self._assignments, fresh, strict=True))
        moved = {r for r, (a, b) in pairs if not can_keep(a, b)}
        lost = sorted(moved | set(self.dead_ranks()))
        self._relaunch(lost, fresh)
        self._assignments = fresh
        if lost:
            label = f"{res.job}/{self.component}"
            remaining = max(timeout - (time.monotonic() - started), 1.0)
            wait_until_ready([self._actors[r] for r in lost], label, remaining, progress)
        return lost

    def _judge_suspects(self, within: float, kill_hung: bool, say) -> None:
        """Wait for Ray's verdict on the ranks that do not answer (see :meth:`repair`);
        kill the ones hung on a live node if ``kill_hung``."""
        res = self.reservation
        # The controller asks the raylets first: one that refuses is fenced by this call
        # (a dead node's workers may still answer for a moment after their raylet died).
        nodes = set(res.controller.suspects(res.job))
        live = [r for r, a in enumerate(self._actors) if a is not None]
        suspects = [live[i] for i in verdict.unanswered([self._actors[r] for r in live])]
        suspects += [r for r in live if self._assignments[r].placement.node_id in nodes]
        suspects = sorted(set(suspects) - set(self.dead_ranks()))
        if not suspects:
            return
        hung = verdict.await_verdict(
            self._actors,
            suspects,
            dead=lambda: set(self.dead_ranks()),
            ask=lambda: res.controller.suspects(res.job),
            within=within,
            say=say,
        )
        if hung and kill_hung:
            say(
                f"{res.job}/{self.component}: ranks {hung} have not answered for "
                f"{within:g}s on live nodes: killed as hung"
            )
            verdict.kill([self._actors[r] for r in hung])

    def restart(self, ranks: Sequence[int], timeout: float = 120.0) -> list[int]:
        """Kill ``ranks`` and start them again in their bundles, with the reservation's
        current assignments; for ranks the job knows are wedged (e.g. blocked in a
        collective with a peer that vanished). Returns the ranks restarted."""
        ranks = sorted(set(ranks))
        bad = [r for r in ranks if not 0 <= r < len(self._actors)]
        if bad:
            raise PlacementError(f"ranks {bad}: out of range (0-{len(self._actors) - 1})")
        if self._launch is None:
            raise PlacementError("restart() needs the group's constructor arguments")
        if not ranks:
            return []
        res = self.reservation
        res.wait_ready(timeout)
        fresh = res.assignments(self.component)
        self._relaunch(ranks, fresh)
        self._assignments = fresh
        wait_until_ready([self._actors[r] for r in ranks], f"{res.job}/{self.component}", timeout)
        return ranks

    def sync(self, restart: bool = False, timeout: float = 300.0) -> SyncResult:
        """Bring the running workers to the reservation's current epoch, after an
        ``apply`` (or a repair): ranks that stopped or moved are killed, ranks that are
        new or moved are started in their bundles, unchanged ranks keep running.

        Args:
            restart: when the component needs a new process group (its world size
                changed, or its rank 0 moved), restart every rank instead of only the
                ones that changed.
            timeout: for the reservation to be ready and the new workers to start.

        Returns:
            What was kept, moved, started and stopped, and why the component needs a
            new process group if it does (``restart_needed``).

        Raises:
            PlacementError: ranks must start but the group was attached, not launched
                here (its constructor arguments are unknown).
        """
        res = self.reservation
        res.wait_ready(timeout)
        fresh = res.assignments(self.component) if self.component in res.components else []
        result = plan_sync(self.component, res.epoch, self._assignments, fresh)
        dead = set(self.dead_ranks()) & set(result.kept)
        if dead:  # kept in place, but its worker is gone: started again in its bundle
            result = msgspec.structs.replace(
                result,
                kept=[r for r in result.kept if r not in dead],
                moved=sorted({*result.moved, *dead}),
            )
        if restart and result.restart_needed:
            every = list(range(len(fresh)))
            result = msgspec.structs.replace(
                result,
                kept=[],
                moved=every[: len(result.kept) + len(result.moved)],
                restarted=True,
            )
        starting = sorted(result.moved + result.started)
        if starting and self._launch is None:
            raise PlacementError(
                "sync() must start ranks and needs the group's constructor arguments: "
                "launch the group with WorkerGroup.launch instead of attach"
            )
        self._stop(result.stopped)
        self._actors = self._actors[: len(fresh)]
        if starting:
            self._relaunch(starting, fresh)
            label = f"{res.job}/{self.component}"
            wait_until_ready([self._actors[r] for r in starting], label, timeout)
        self._assignments = fresh
        return result

    def shutdown(self, cleanup: str | None = None, timeout: float = 30.0) -> None:
        """Kill every worker; the reservation stays.

        Args:
            cleanup: a method to call on every worker first (e.g. to destroy a process
                group or flush a checkpoint); the workers get ``timeout`` seconds for it.
        """
        if cleanup is not None and self._actors:
            refs = [getattr(a, cleanup).remote() for a in self._actors]
            ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self._actors = []
