"""The running workers of one group, rank by rank: each rank's actor, the name a detached
one is registered under, the tag its processes carry, the assignment it was started
with, the replacements started beside it ahead of a move (make before break), and the
standbys on held spares, promoted in place of lost ranks (:mod:`clients.standby`)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

import ray

from clients import slot_sweep
from clients.launching import (
    WORKER_NAMESPACE,
    detached_worker,
    options_for,
    rank_kwargs_for,
    worker_name,
)
from clients.standby import (
    TAKEN,
    Standbys,
    forget_promotion,
    key_of,
    promote_here,
    standby_name,
)
from clients.verdict import actor_dead
from controller import PlacementError
from controller.state.assignments import Assignment
from controller.surface import TAG, new_tag


class Launch:
    """What a group's workers are started with: the actor class, its constructor's
    arguments, the user's environment and options, per-rank keyword arguments, and what
    each start adds to a rank's environment (an engine's leased ports,
    :func:`clients.engines.engine_environment`)."""

    def __init__(
        self, actor_cls, args, kwargs, env, actor_options, rank_kwargs, per_rank_env=None
    ) -> None:
        self.actor_cls, self.args, self.kwargs = actor_cls, args, kwargs
        self.env, self.actor_options, self.rank_kwargs = env, actor_options, rank_kwargs
        self.per_rank_env = per_rank_env


# A standby is named after its bundle; Ray frees a name once it sees the actor dead:
# milliseconds, unless its node died unseen (then a group shutting down waits this long).
STANDBY_NAMES_FREE_S = 10.0


class Roster:
    """One group's workers by rank (see the module docstring).

    Args:
        job, component: whose workers.
        actors: the running actor of each rank (None: missing).
        assignments: what each rank was started with.
        detached: workers are named and outlive their driver.
        launch: how to start a worker; None for a group attached without it.
    """

    def __init__(
        self,
        job: str,
        component: str,
        actors: list,
        assignments: list[Assignment],
        detached: bool,
        launch: Launch | None,
        names: list[str | None] | None = None,
    ) -> None:
        self.job, self.component, self.detached, self.launch = job, component, detached, launch
        self.actors = list(actors)
        self.assignments = list(assignments)
        self.names = list(names) if names is not None else [None] * len(actors)
        # A detached worker's tag follows from its name, so an attached group has it too.
        self.tags = [
            new_tag(a.uid, n, True) if n else None
            for a, n in zip(self.assignments, self.names, strict=False)
        ]
        self.tags += [None] * (len(self.actors) - len(self.tags))
        self.prepared: dict[int, tuple[Any, Assignment, str | None, str]] = {}
        self.held: list = []  # workers left on nodes away, until Ray reports them dead
        self._ready: dict[int, Any] = {}  # rank -> its replacement's __ray_ready__ ref
        self.standbys = Standbys()

    def require_launch(self, what: str) -> Launch:
        if self.launch is None:
            raise PlacementError(
                f"{what} needs the group's constructor arguments: launch it with "
                "WorkerGroup.launch, or pass them to WorkerGroup.attach"
            )
        return self.launch

    def start(
        self, a: Assignment, world: int, name: str | None = None, standby: bool = False
    ) -> tuple[Any, str | None, str]:
        """Start a worker for ``a`` (named ``name`` if detached; default the rank's
        name); the actor, its name (a detached one's) and its tag. A ``standby`` is no
        rank: it gets the constructor's common arguments only, and is named ``name``
        whether detached or not."""
        launch = self.require_launch("starting a worker")
        rank = a.placement.rank
        extra = {} if standby else rank_kwargs_for(launch.rank_kwargs, world)[rank]
        options = options_for(a, launch.env, launch.actor_options)
        name = name or worker_name(self.job, self.component, rank)
        tag = new_tag(a.uid, name, self.detached)
        options["runtime_env"]["env_vars"][TAG] = tag
        if launch.per_rank_env is not None:  # a standby's on its spare, for its bundle
            options["runtime_env"]["env_vars"].update(launch.per_rank_env(a))
        if self.detached or standby:  # a standby is named always: status finds it
            options.update(name=name, namespace=WORKER_NAMESPACE)
        if self.detached:
            options.update(lifetime="detached")
        args, kwargs = launch.args, {**launch.kwargs, **extra}
        try:
            actor = launch.actor_cls.options(**options).remote(*args, **kwargs)
        except ValueError:  # the name is taken
            if self.detached or not standby:
                raise
            # A crashed driver's standby of this bundle, not yet reaped: start this one
            # unnamed (status cannot see it) rather than fail the launch.
            del options["name"], options["namespace"]
            actor = launch.actor_cls.options(**options).remote(*args, **kwargs)
        return actor, name if self.detached else None, tag

    def end_leftovers(
        self, stopped: list[tuple[Assignment, str | None]], away: set[str] = frozenset()
    ) -> None:
        """End what stopped workers (their assignment and tag) left on their nodes, but
        on the nodes ``away``."""
        by_node: dict[str, list[str]] = {}
        for a, tag in stopped:
            if tag and a.placement.node_id not in away:
                by_node.setdefault(a.placement.node_id, []).append(tag)
        if by_node:
            slot_sweep.end_left_behind(by_node)

    def stop(
        self, ranks: list[int], reused: set[int] | None = None, away: set[str] = frozenset()
    ) -> None:
        """Kill ranks and end what they left on their nodes (:mod:`clients.slot_sweep`);
        the names of the detached ones in ``reused`` (default all) are free again when
        this returns, for a new worker of the same name.

        A rank on a node ``away`` (a suspect its slot moved off) is left alone: killing
        it, or dropping the last handle of an actor the driver owns, has Ray's GCS send
        that node's raylet a request that cannot arrive, on the connection its health
        checks use (which, after a long cut, has stayed stuck past the heal until the GCS
        declared the node dead). Its handle is held until Ray reports it dead; the
        controller ends it there, with what it started, when the node answers again; a
        detached one keeps its name meanwhile (its replacement gets another)."""
        self.held = [a for a in self.held if not actor_dead(a)]
        gone = {r for r in ranks if r < len(self.assignments)
                and self.assignments[r].placement.node_id in away}  # fmt: skip
        self.held += [self.actors[r] for r in gone if self.actors[r] is not None]
        ranks = [r for r in ranks if r not in gone]
        draining = slot_sweep.draining_nodes() if ranks else set()
        inside = [
            (self.actors[r], self.tags[r], a.placement.node_id)
            for r in ranks
            if r < len(self.assignments)
            and (a := self.assignments[r]).placement.node_id in draining
            and self.actors[r] is not None
            and self.tags[r]
        ]
        slot_sweep.end_from_inside(inside)  # no task runs on a draining node
        for r in ranks:
            with contextlib.suppress(Exception):  # most are already dead with their node
                ray.kill(self.actors[r], no_restart=True)
            name = self.names[r] if r < len(self.names) else None
            if (
                name
                and r < len(self.assignments)
                and name == standby_name(self.job, self.component, self.assignments[r])
            ):
                forget_promotion(name)  # a promoted standby's record goes with it
        self.end_leftovers(
            [(self.assignments[r], self.tags[r]) for r in ranks if r < len(self.assignments)],
            away,
        )
        reused = set(ranks) if reused is None else reused
        names = [self.names[r] for r in ranks if self.detached and self.names[r] and r in reused]
        self.wait_names_free(names)

    @staticmethod
    def wait_names_free(names: list[str], within: float = 60.0) -> None:
        """Until Ray has freed each of ``names`` (its actor killed), at most ``within``
        seconds in all: a new worker of the same name can start then."""
        deadline = time.monotonic() + within
        for name in names:
            while time.monotonic() < deadline:
                try:
                    ray.get_actor(name, namespace=WORKER_NAMESPACE)
                except ValueError:
                    break
                time.sleep(0.05)

    def relaunch(
        self,
        ranks: list[int],
        fresh: list[Assignment],
        away: set[str] = frozenset(),
        promote_timeout: float = 60.0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """Start ``ranks`` anew in ``fresh`` (ranks past the end are added): a prepared
        replacement made for the same assignment is swapped in, a standby in the rank's
        new bundle promoted, the others started after the old worker is gone. On the
        nodes ``away`` (cut off, their slots moved: the controller ends what was left
        there when they answer again) nothing is swept.

        A standby that has not answered its promotion within ``promote_timeout`` (still
        in a long constructor, or on a node that went silent) is killed and the rank
        started anew; one already promoted to another rank is left alone and the rank
        started anew. Each is said on ``say`` (default stderr)."""
        say = say or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True))
        left = {r for r in ranks if r < len(self.assignments)
                and self.assignments[r].placement.node_id in away}  # fmt: skip
        self.actors += [None] * (len(fresh) - len(self.actors))
        self.names += [None] * (len(fresh) - len(self.names))
        self.tags += [None] * (len(fresh) - len(self.tags))
        ready = [r for r in ranks if r in self.prepared and self.prepared[r][1] == fresh[r]]
        standing = {r: s for r in ranks if r not in ready and (s := self.standbys.take(fresh[r]))}
        old = [r for r in ranks if r < len(self.assignments)]
        swapped = set(ready) | set(standing)
        self.stop(old, reused={r for r in old if r not in swapped}, away=away)  # swapped: new names
        promoted = {}
        for r in ranks:
            if r in ready:
                self.actors[r], _, self.names[r], self.tags[r] = self.prepared.pop(r)
                self._ready.pop(r, None)
            elif r in standing:
                actor, own, self.names[r], self.tags[r] = standing[r]
                self.actors[r] = actor
                promoted[r] = self._promote(actor, fresh[r], own, self.tags[r], self.names[r])
            else:
                self.actors[r], self.names[r], self.tags[r] = self.start(
                    fresh[r], len(fresh), self._fresh_name(r, fresh[r]) if r in left else None
                )
        deadline = time.monotonic() + promote_timeout
        label = f"{self.job}/{self.component}"
        for r, ref in promoted.items():  # each standby is its rank now
            try:
                _, did = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.1))
            except ray.exceptions.GetTimeoutError:
                say(
                    f"{label}: the standby for rank {r} did not answer its promotion within "
                    f"{promote_timeout:.0f}s (still starting, or its node silent): killed, "
                    "and the rank started anew"
                )
                with contextlib.suppress(Exception):
                    ray.kill(self.actors[r], no_restart=True)
                self.actors[r], self.names[r], self.tags[r] = self.start(fresh[r], len(fresh))
                continue
            except ray.exceptions.RayActorError:  # it died meanwhile: a start after all
                self.actors[r], self.names[r], self.tags[r] = self.start(fresh[r], len(fresh))
                continue
            if did == TAKEN:  # another driver made it another rank: not ours to take
                say(f"{label}: the standby for rank {r} is another rank's now: rank started anew")
                self.actors[r], self.names[r], self.tags[r] = self.start(fresh[r], len(fresh))
        self.drop_prepared(keep=set())
        self.assignments = list(fresh)

    def _fresh_name(self, rank: int, a: Assignment) -> str | None:
        """The name of a detached rank started while its old worker, on a node away,
        still holds the rank's own: the one ``attach`` looks for first (by epoch)."""
        return f"{worker_name(self.job, self.component, rank)}@{a.epoch}" if self.detached else None

    def _promote(self, actor, a: Assignment, own: Assignment, tag: str, name: str | None):
        """Have the standby ``actor`` (started for ``own``; detached: named ``name``)
        become the rank of ``a`` (its ref: the pid and what was done,
        :func:`clients.standby.promote_here`)."""
        launch = self.require_launch("promoting a standby")
        env = options_for(a, launch.env, launch.actor_options)["runtime_env"]["env_vars"]
        if tag:
            env[TAG] = tag  # the tag its processes were started with
        drop = tuple(sorted(set(own.runtime_env_vars()) - set(a.runtime_env_vars())))
        return actor.__ray_call__.remote(promote_here, env, name if self.detached else None, drop)

    def drop_standbys(self, keep: set, free_names: bool = False) -> None:
        """Kill the standbys not in ``keep`` (bundle keys) and end what they left on
        their nodes; with ``free_names``, wait (``STANDBY_NAMES_FREE_S`` at most) until
        their names are free for new standbys in the same bundles (a group launched
        again on the same held spares)."""
        dropped = self.standbys.drop(keep)
        self.end_leftovers(dropped)
        if free_names:
            names = [standby_name(self.job, self.component, a) for a, _ in dropped]
            self.wait_names_free(names, within=STANDBY_NAMES_FREE_S)

    def refill_standbys(self, wanted: list[Assignment]) -> list:
        """Standbys for ``wanted`` (the held spares' bundles): those whose spare is gone
        are killed, the missing ones started; the actors started."""
        self.drop_standbys({key_of(a) for a in wanted})
        started = []
        for a in wanted:
            if key_of(a) in self.standbys.running:
                continue
            name = standby_name(self.job, self.component, a)
            try:
                actor, name, tag = self.start(a, 0, name, standby=True)
            except ValueError:  # the name is taken
                if not self.detached:
                    raise
                # Another driver of this detached group started it a moment ago (both
                # refilling after a repair): it is this group's standby too.
                actor = detached_worker(name, "standby")
                self.standbys.adopt(a, actor, name)
                started.append(actor)
                continue
            self.standbys.running[key_of(a)] = (actor, a, name, tag)
            started.append(actor)
        return started

    def shrink(self, world: int, wait: bool = True) -> None:
        """Kill the ranks past ``world``, and their replacements if any wait; with
        ``wait``, until a detached one's name is free again."""
        gone = list(range(world, len(self.actors)))
        self.stop(gone, reused=None if wait else set())
        del self.actors[world:], self.names[world:], self.tags[world:], self.assignments[world:]
        self.drop_prepared(keep={r for r in self.prepared if r < world})

    def ready_ref(self, rank: int):
        """The ``__ray_ready__`` ref of ``rank``'s waiting replacement."""
        return self._ready[rank]

    def swap_in(self, ranks: list[int], away: set[str] = frozenset()) -> None:
        """Make the waiting replacements of ``ranks`` the ranks, their old workers
        stopped (but on the nodes ``away``); the other replacements keep waiting."""
        self.stop(ranks, reused=set(), away=away)
        for r in ranks:
            self.actors[r], self.assignments[r], self.names[r], self.tags[r] = self.prepared.pop(r)
            self._ready.pop(r, None)

    def prepared_ready(self) -> bool:
        """Whether every replacement waiting has finished starting."""
        refs = [self._ready[r] for r in self.prepared]
        return len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) == len(refs)

    def prepare(self, ranks: list[int], fresh: list[Assignment]) -> list[int]:
        """Start replacements of ``ranks`` for ``fresh`` beside the running workers (a
        detached one is named after its assignment's epoch, so both live at once and a
        restarted driver finds it); those already started for the same assignment
        stand. A standby running in a rank's new bundle (the repair made its held spare
        the rank's slot) is the replacement: promoted now, ready once the promotion
        answers, and no process starts. Returns the ranks with a replacement waiting."""
        same = {r for r in ranks if r in self.prepared and self.prepared[r][1] == fresh[r]}
        self.drop_prepared(keep=same)
        for r in ranks:
            if r in self.prepared:
                continue
            standing = self.standbys.take(fresh[r])
            if standing is not None:
                actor, own, name, tag = standing
                self.prepared[r] = (actor, fresh[r], name, tag)
                self._ready[r] = self._promote(actor, fresh[r], own, tag, name)
            else:
                name = f"{worker_name(self.job, self.component, r)}@{fresh[r].epoch}"
                actor, name, tag = self.start(fresh[r], len(fresh), name)
                self.prepared[r] = (actor, fresh[r], name, tag)
                self._ready[r] = actor.__ray_ready__.remote()
        return sorted(self.prepared)

    def drop_prepared(self, keep: set[int]) -> None:
        """Kill the replacements not in ``keep`` (made for assignments that changed)."""
        dropped = []
        for r in [r for r in self.prepared if r not in keep]:
            actor, a, _, tag = self.prepared.pop(r)
            self._ready.pop(r, None)
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            dropped.append((a, tag))
        self.end_leftovers(dropped)
