"""Worker groups: one actor per rank of a component, each in its bundle, with its env.

The group's launch, attach, repair and restart; which ranks it sends work to and its
calls are :mod:`clients.serving`'s, following a new epoch :mod:`clients.moves`'s, its
ranks' actors :mod:`clients.roster`'s, its standbys :mod:`clients.standby`'s, running
short :mod:`clients.short`'s.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from clients import verdict
from clients.engines import engine_environment
from clients.launching import (
    RankKwargs,
    actor_class,
    rank_kwargs_for,
    wait_until_ready,
)
from clients.moves import Moves
from clients.roster import Launch, Roster
from clients.serving import Serving
from clients.short import Replacements
from clients.standby import (
    end_other_standbys,
    find_ranks,
    held_groups,
    key_of,
    standbys_to_come,
)
from clients.sync import can_keep
from controller import PlacementError
from controller.state.assignments import Assignment


class WorkerGroup(Serving, Moves):
    """The actors of one component, in rank order.

    Workers belong to the driver that launched them (or, with ``detached=True``, to no
    driver); the controller never kills them. ``shutdown`` ends the workers and keeps the
    reservation, so the next launch schedules at once.
    """

    def __init__(
        self, reservation: Any, component: str, roster: Roster, attached: bool = False
    ) -> None:
        self.reservation = reservation
        self.component = component
        self._roster = roster
        self._short = Replacements(reservation, component, roster, None)
        if attached:
            # A dead driver's record of running short goes: repair() finds what is lost
            # anew (a replacement it started is attached as the rank, holding no weights).
            self._short.stop()

    @property
    def detached(self) -> bool:
        return self._roster.detached

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
            *args: constructor arguments, the same for every rank.
            env: extra environment variables (placectl's own keys are refused).
            actor_options: further ``.options()`` (e.g. ``max_concurrency``); placement
                options are the reservation's and are refused.
            detached: name the workers after job/component/rank and detach them, so a
                restarted driver finds them with :meth:`attach`.
            rank_kwargs: per-rank keyword arguments, a list (one dict per rank) or a
                function of the rank; merged over ``kwargs``.
            **kwargs: constructor keyword arguments, the same for every rank.
            wait: wait until every worker's constructor has returned (default), with
                progress on stderr every few seconds.
            timeout: how long to wait; then every worker is killed and
                :class:`ReservationTimeout` raised.
            progress: where progress goes (default stderr).
        """
        reservation.wait_ready(timeout, progress=progress)
        assignments = reservation.assignments(component)
        rank_kwargs_for(rank_kwargs, len(assignments))  # checked before anything starts
        leased = engine_environment(reservation, component, env)
        launch = Launch(
            actor_class(worker_cls), args, kwargs, env, actor_options, rank_kwargs, leased
        )
        roster = Roster(reservation.job, component, [], [], detached, launch)
        roster.relaunch(list(range(len(assignments))), assignments)
        group = cls(reservation, component, roster)
        standbys = group.refill_standbys()
        label = f"{reservation.job}/{component}"
        if (coming := standbys_to_come(reservation, component)) is not None:
            (progress or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True)))(coming)
        if wait:
            wait_until_ready(roster.actors, label, timeout, progress)
            if standbys:
                wait_until_ready(standbys, f"{label} standbys", timeout, progress)
        return group

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
            worker_cls: the class the group was launched with; with it (and the same
                ``*args``, ``env``, ``actor_options``, ``rank_kwargs`` and ``**kwargs``)
                the attached group can :meth:`repair` and :meth:`sync` like a launched
                one, and a rank whose worker is gone (its node was lost while no driver
                was running) is attached as missing, for
                ``repair()`` to start. Without them a missing worker is an error.

        Raises:
            PlacementError: a worker is missing and ``worker_cls`` was not given.
        """
        assignments = reservation.assignments(component, allow_degraded=True)
        actors, names, standing = find_ranks(reservation, component, assignments, worker_cls)
        launch = None
        if worker_cls is not None:
            leased = engine_environment(reservation, component, env)
            launch = Launch(
                actor_class(worker_cls), args, kwargs, env, actor_options, rank_kwargs, leased
            )
        roster = Roster(reservation.job, component, actors, assignments, True, launch, names)
        if reservation.spec.component(component).standby:
            roster.standbys.find(reservation.job, component, reservation.standbys(component))
        for a, actor, name in standing:  # promoted by the next repair()
            roster.standbys.adopt(a, actor, name)
        return cls(reservation, component, roster, attached=True)

    @property
    def actors(self) -> list:
        """Actor handles in rank order."""
        return list(self._roster.actors)

    @property
    def assignments(self) -> list[Assignment]:
        """The assignments the running workers were started with, in rank order."""
        return list(self._roster.assignments)

    def __len__(self) -> int:
        return len(self._roster.actors)

    @property
    def standbys(self) -> list:
        """The standby processes running on the reservation's held spares (a component
        with ``standby: true``), none of them a rank: see :mod:`clients.standby`."""
        return [s[0] for s in self._roster.standbys.running.values()]

    def refill_standbys(self) -> list:
        """Start standbys on held spares that have none, and end those whose spare the
        reservation no longer holds (the component says ``standby: true``); the actors
        started (not waited for). :meth:`repair` calls it; call it at a step boundary
        to use a spare held since (the controller takes a new one after each repair):
        when nothing changed, one GCS read for the held spares and one per standby
        (Ray's actor table, to replace a dead one)."""
        if not self.reservation.spec.component(self.component).standby:
            return []
        with self._short.lock:  # the background start takes standbys too
            if any(r not in self._roster.prepared for r in self._short.lost):
                # A lost rank's replacement may be the standby in its new bundle, on a
                # spare the reservation holds no more: left until it is taken.
                return []
            return self._refill_standbys()

    def _refill_standbys(self) -> list:
        # A standby that crashed, or whose spare died, is listed no more: Ray's actor
        # table says so (one read per standby), and a new one starts in its bundle.
        died = self._roster.standbys.dead(verdict.actor_dead)
        if died:
            label = f"{self.reservation.job}/{self.component}"
            print(f"placectl: {label}: {len(died)} standby(s) dead: starting new ones",
                  file=sys.stderr, flush=True)  # fmt: skip
        running = {key[0] for key in self._roster.standbys.running}
        if not died and held_groups(self.reservation) == running:
            return []
        return self._roster.refill_standbys(self.reservation.standbys(self.component))

    def dead_ranks(self) -> list[int]:
        """The ranks Ray reports dead now: their node is dead, or their actor is (a
        crash, an OOM kill), or they have no worker (attached while missing)."""
        nodes = self.reservation.controller.dead_nodes(
            a.placement.node_id for a in self._roster.assignments
        )
        return [
            r
            for r, (a, actor) in enumerate(
                zip(self._roster.assignments, self._roster.actors, strict=True)
            )
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
        a word (Ray still calls it alive), or it may be hung. ``repair`` first waits, at
        most ``hung_after`` seconds, for the verdict (:func:`clients.verdict.judge`): the
        controller fences a node whose raylet refuses connections at once, one silent
        for a few seconds after that, and Ray then reports its ranks dead. A suspect
        that answers again was only slow; one silent on a live node for ``hung_after``
        seconds is hung and killed. A merely busy worker answers: never a suspect.

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
            The relaunched ranks (empty when none was gone or moved). For a component
            with ``on_loss: continue``: the ranks newly lost, returned once the verdict
            on them is in (Ray's, or their node's slot moved), none relaunched;
            :attr:`live` leaves them out, their replacements start in the background,
            and :meth:`admit` makes them ranks again (:mod:`clients.short`).

        Raises:
            ReservationTimeout: the reservation is not ready within ``timeout``.
            PlacementError: the group was attached without its launch arguments (its
                constructor is unknown), or its world size changed (use :meth:`sync`).
        """
        self._roster.require_launch("repair()")
        started = time.monotonic()
        res = self.reservation
        say = progress or (lambda m: print(f"placectl: {m}", file=sys.stderr, flush=True))
        nodes = verdict.judge_group(
            self._roster.actors,
            self._roster.assignments,
            res,
            lambda: set(self.dead_ranks()),
            timeout,
            hung_after,
            say,
        )
        if res.spec.component(self.component).runs_short:
            # on_loss: continue: the job goes on with the ranks that answer; the lost
            # ones' replacements start in the background (clients.short). Lost: those
            # Ray reports dead, and those on a node the controller moved the job off
            # (Ray calls a silent node alive for a minute).
            away = verdict.away(nodes)
            moved = {
                r for r, a in enumerate(self._roster.assignments) if a.placement.node_id in away
            }
            lost = sorted((set(self.dead_ranks()) | moved) - set(self._short.lost))
            if lost:
                self._short.lose(lost, away)
                say(
                    f"{res.job}/{self.component}: ranks {lost} lost; running short on "
                    f"{len(self.live)} of {len(self._roster.actors)} until the job admits "
                    "their replacements"
                )
            return lost
        since = min((a.epoch for a in self._roster.assignments), default=res.epoch)
        remaining = max(timeout - (time.monotonic() - started), 1.0)
        verdict.wait_placed(res, self.component, since, nodes, remaining, progress)
        fresh = res.assignments(self.component, allow_degraded=True)
        if len(fresh) != len(self._roster.assignments):
            raise PlacementError(
                f"{res.job}/{self.component} has {len(fresh)} ranks now, the group "
                f"{len(self._roster.assignments)}: its configuration changed; sync() follows it"
            )
        pairs = enumerate(zip(self._roster.assignments, fresh, strict=True))
        moved = {r for r, (a, b) in pairs if not can_keep(a, b)}
        lost = sorted(moved | set(self.dead_ranks()))
        # Standbys promoted below, or on a spare still held, stay; the rest go first, as
        # they may hold resources of a bundle a relaunched rank needs.
        keep = {key_of(fresh[r]) for r in lost}
        if len(self._roster.standbys):
            held = held_groups(res)
            keep |= {key for key in self._roster.standbys.running if key[0] in held}
        self._roster.drop_standbys(keep)
        ended = end_other_standbys(res, self.component, [fresh[r] for r in lost])
        if ended:
            say(f"{res.job}/{self.component}: ended {len(ended)} standby(s) of another "
                "component on the held spare its ranks take")  # fmt: skip
        remaining = max(timeout - (time.monotonic() - started), 1.0)
        self._roster.relaunch(
            lost, fresh, away=verdict.away(nodes), promote_timeout=remaining, say=say
        )
        if lost:
            label = f"{res.job}/{self.component}"
            remaining = max(timeout - (time.monotonic() - started), 1.0)
            wait_until_ready([self._roster.actors[r] for r in lost], label, remaining, progress)
        self.refill_standbys()
        return lost

    def restart(self, ranks: Sequence[int], timeout: float = 120.0) -> list[int]:
        """Kill ``ranks`` and start them again in their bundles, with the reservation's
        current assignments; for ranks the job knows are wedged (e.g. blocked in a
        collective with a peer that vanished). Returns the ranks restarted."""
        ranks = sorted(set(ranks))
        bad = [r for r in ranks if not 0 <= r < len(self._roster.actors)]
        if bad:
            raise PlacementError(f"ranks {bad}: out of range (0-{len(self._roster.actors) - 1})")
        self._roster.require_launch("restart()")
        if not ranks:
            return []
        res = self.reservation
        res.wait_ready(timeout)
        with self._short.lock:
            self._roster.relaunch(ranks, res.assignments(self.component))
            self._short.settled(ranks)
        label = f"{res.job}/{self.component}"
        wait_until_ready([self._roster.actors[r] for r in ranks], label, timeout)
        return ranks

    def shutdown(self, cleanup: str | None = None, timeout: float = 30.0) -> None:
        """Kill every worker; the reservation stays.

        Args:
            cleanup: a method to call on every worker first (e.g. to destroy a process
                group or flush a checkpoint); the workers get ``timeout`` seconds for it.
        """
        self._short.stop()
        if cleanup is not None and self._roster.actors:
            refs = [getattr(a, cleanup).remote() for a in self.live.values()]
            ray.wait(refs, num_returns=len(refs), timeout=timeout)
        self._roster.drop_standbys(set(), free_names=True)
        self._roster.shrink(0, wait=False)
