"""Recovery on start, then the reconcile loop's ticks.

A tick reads only what changed: Ray's node events (pushed by the GCS), and the groups of
the jobs on the nodes that changed. Every ``settings.full_check_period`` it reads every
node and every group of every reservation, which catches what no event reports (a group
removed behind placectl's back), and sweeps orphans. It then hands work on: degraded
reservations to the repairer, cut-short releases and applies to be finished. Warm-up
touches only nodes where a reservation may land.

It changes records only through the state owner and the operations it calls, and keeps
to itself the loop's bookkeeping (when the last full check ran, which nodes were warmed,
which follow-ups are in flight).
"""

from __future__ import annotations

import enum
import functools
import logging
import time
from collections.abc import Callable, Container

from controller.runtime import core
from controller.runtime.core import groups
from controller.runtime.core.context import Context
from controller.runtime.core.inbox import Kind, Source
from controller.runtime.core.stewards import Trigger
from controller.runtime.core.store import Loaded
from controller.runtime.edge import REMOVED, GroupInfo, NodeInfo
from controller.runtime.steps.checks import Checker
from controller.runtime.steps.holding import HOLD, Holder
from controller.runtime.steps.repair import Repairer
from controller.runtime.steps.reserving import Reserver
from controller.state.records import (
    AUTO,
    DEGRADED,
    PENDING,
    READY,
    RELEASING,
    UNTIL_BACK,
    ReservationRecord,
)

log = logging.getLogger("placectl.controller")


class Reconciler:
    """Brings the table in line with Ray: once at start, then at every tick."""

    def __init__(
        self,
        ctx: Context,
        checker: Checker,
        reserver: Reserver,
        repairer: Repairer,
        holder: Holder,
    ) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self._stewards = ctx.stewards
        self._records = ctx.records
        self._checker = checker
        self._reserver = reserver
        self._repairer = repairer
        self._holder = holder
        self.settings = ctx.settings
        self._prefix = ctx.prefix
        self._tasks = ctx.tasks
        self._demand = ctx.demand
        self._last_full = 0.0
        self._warmed: dict[str, float] = {}
        self.tick_stats: dict[str, float] = {}

    # ------------------------------------------------------------ recovery
    async def recover(self) -> Loaded:
        """Reload the table and bring it in line with Ray: roll back ``pending``
        reservations cut short, finish ``releasing`` ones, clear the intent of an apply
        cut short, check the rest, remove orphans.

        Raises:
            TableUnreadable: nothing was changed; the controller refuses to act.
        """
        await self._io.node_events()  # subscribe first: no death between read and watch
        loaded = await self._state.load()
        await self._nodes.refresh()
        self._nodes.cordons(self._state.cordons, Source.TABLE)
        self._nodes.owed(self._owed())
        table = await self._io.groups()
        for job in sorted(self._state.records):
            res = self._state.records[job]
            if res.applying is not None:
                log.warning("rolling back an apply to %r cut short by a restart", job)
                cleared = functools.partial(self._records.applying, res, None)
                await self._stewards.run(job, Trigger.CLEAR_INTENT, cleared)  # or stop here
                res = self._state.records[job]  # its groups are orphans now
            if res.state in (PENDING, RELEASING):
                log.warning("finishing %s reservation %r cut short by a restart", res.state, job)
                await self._finish_release(job)
            else:
                await self._checker.check(job, table)
        await self._remove_orphans(table)
        self._last_full = core.now()
        log.info(
            "recovered %d reservation(s)%s",
            len(self._state.records),
            f", {loaded.migrated} migrated from table format 1" if loaded.migrated else "",
        )
        return loaded

    def _owed(self) -> dict[str, set[str]]:
        """Node -> the reservations whose groups the table keeps there until it answers
        (:data:`UNTIL_BACK`): written with the commit that moved their slots off it, so
        a doubt outlives the controller that had it."""
        owed: dict[str, set[str]] = {}
        for res in self._state.records.values():
            for x in res.leaving:
                if x.remove_at == UNTIL_BACK:
                    owed.setdefault(x.node_id, set()).add(res.uid)
        return owed

    # ------------------------------------------------------------ orphans
    def _orphans(self, table: dict[str, GroupInfo]) -> set[str]:
        """Live groups with this controller's prefix that no record names: left by a call
        cut short, or by a removal Ray did not confirm in time. Groups a repair or an
        apply is making right now are not orphans."""
        making = self._repairer.making() | self._holder.making()
        for r in self._state.records.values():
            if r.applying is not None:
                making.update(r.applying.group_names)
        return {
            gid
            for gid, info in table.items()
            if info.state != REMOVED
            and info.name.startswith(self._prefix)
            and not self._state.references(info.name, gid)
            and info.name not in making
        }

    async def _remove_orphans(self, table: dict[str, GroupInfo]) -> None:
        orphans = self._orphans(table)
        if orphans:
            log.warning("removing %d orphaned placement groups: %s", len(orphans), sorted(orphans))
            left = await groups.remove_verified(self._io, orphans, self.settings.removal_timeout)
            if left:
                log.warning("orphans not removed yet: %s", sorted(left))

    async def _sweep(self, orphans: set[str]) -> None:
        try:
            await self._remove_orphans(await self._io.groups(sorted(orphans)))
        except Exception as e:
            log.info("removing orphans: %s", e)

    # ------------------------------------------------------------ ticks
    async def tick(self, full: bool | None = None) -> None:
        """One pass of the loop, in steps; a full pass every
        ``settings.full_check_period`` (unless ``full`` says) checks every job.

        1. **Refresh the world**: Ray's node events and draining nodes, posted to the node
           view's inbox with every other fact waiting there (the raylet watch's, a
           repair's, the operator's), settled in order, and the jobs on every node a
           fact changed marked for a check; Ray's whole node table when a node joined or
           at a full pass.
        2. **Judge**: the jobs the events touched (every job at a full pass), against
           Ray's group table; each verdict is a ``CHECK`` step of the job's steward.
        3. **Orphans**: at a full pass, groups no record names are removed, in a task.
        4. **Find and answer**: one pass finds what each reservation asks for, as typed
           :class:`Finding` s (old slots on drained nodes due, an apply's intent left,
           a broken slot, a slot on a draining node, held spares due, a release cut
           short), and posts each to its one answer, which runs as a step of the job's
           steward (:meth:`_answers`).
        5. **Demand**: what nobody asks of the autoscaler any more, withdrawn.
        6. **Housekeep**: an idle worker kept on each reserved node; the pass's figures.
        """
        started, cpu = time.perf_counter(), time.process_time()
        full, joined = await self._refresh(full)  # 1
        jobs, table = await self._judge(full)  # 2
        if full and self._tasks.get("sweep", "orphans") is None:  # 3
            orphans = self._orphans(await self._io.groups() if not jobs else table)
            if orphans:
                self._tasks.start("sweep", "orphans", self._sweep(orphans))
        self._follow_up(joined)  # 4
        await self._prune_demand()  # 5
        self._warm_nodes()  # 6
        self.tick_stats = {
            "wall_s": time.perf_counter() - started,
            "cpu_s": time.process_time() - cpu,
            "jobs_checked": len(jobs),
            "full": float(full),
        }

    async def _refresh(self, full: bool | None) -> tuple[bool, bool]:
        """Step 1: whether this pass is full, and whether room may have appeared (a node
        joined or came back to placement)."""
        now = core.now()
        await self._checker.drain_events()
        try:
            await self._nodes.refresh_draining()
        except Exception as e:  # the last answer stands; the next tick asks again
            log.info("reading Ray's draining nodes: %s", e)
        facts = self._checker.follow_up()
        if full is None:
            full = now - self._last_full >= self.settings.full_check_period
        if full or any(f.kind == Kind.JOINED for f in facts):
            await self._nodes.refresh()
            self._checker.follow_up()
        if full:
            self._last_full = now
        return full, self._checker.take_room()

    async def _judge(self, full: bool) -> tuple[set[str], dict[str, GroupInfo]]:
        """Step 2: the settled jobs checked, and Ray's table of their groups (of every
        group at a full pass)."""
        asked = self._checker.take_rechecks()
        jobs = set(self._state.records) if full else asked
        jobs = {j for j in jobs if (r := self._state.get(j)) is not None and r.settled}
        table: dict[str, GroupInfo] = {}
        if jobs:
            ids = sorted(g for j in jobs for g in self._state.records[j].group_ids())
            table = await self._io.groups(None if full else ids)
            for job in sorted(jobs):
                await self._checker.check(job, table)
        return jobs, table

    def _follow_up(self, joined: bool) -> None:
        """Step 4: one pass over the reservations finds what each asks for
        (:func:`findings`), and each finding is posted to its answer (:meth:`_answers`).
        A job a call or a step holds, or one being reserved, is left to the next pass."""
        if joined:
            self._repairer.retry_now()  # a spare may have arrived: try at once
            self._holder.retry_now()
        draining, now = set(self._nodes.draining), core.wall()
        away = set(self._nodes.in_doubt())
        answers = self._answers()
        for job, res in list(self._state.records.items()):
            if self._stewards.busy(job) or self._reserver.in_progress(job):
                continue
            due = self._holder.due(res)
            for finding in findings(res, draining, self._nodes, now, due, away):
                answers[finding](job)

    def _answers(self) -> dict[Finding, Callable[[str], None]]:
        """The one table of what each finding gets: a task of the job's, or the
        repairer's or the holder's schedule (each posts a step to the job's steward)."""
        start = self._tasks.start
        return {
            LEAVING_DUE: lambda job: start("leave", job, self._repairer.drop_leaving(job)),
            INTENT_LEFT: lambda job: start("clear intent", job, self._clear_intent(job)),
            BROKEN: self._repairer.schedule,
            ON_DRAINING: self._repairer.schedule_move,  # make before break, before the deadline
            SPARES_DUE: self._holder.schedule,
            CUT_SHORT: lambda job: start("finish", job, self._finish_release(job)),
        }

    async def _prune_demand(self) -> None:
        """Withdraw what nobody asks for any more: wants of jobs gone, spares of
        reservations ready with nothing on a draining node (repaired meanwhile), and held
        spares asked for a reservation that holds them all now, or wants fewer."""
        demand, draining = self._demand, set(self._nodes.draining)
        await demand.keep_only(set(self._state.records) | self._tasks.keys("reserve"))
        self._holder.keep_only(set(self._state.records))
        placed = await demand.placed()
        if any(k.startswith("spare/") for k in placed):
            self._repairer.retry_now()  # a node joined for a repair: it runs now
        if any(k.startswith(f"{HOLD}/") for k in placed):
            self._holder.retry_now()  # one joined to be held: taken at the next tick
        for key in list(demand.wants()):
            kind, job = key.split("/", 1)
            res = self._state.get(job)
            settled = res is not None and res.state == READY and not res.node_ids() & draining
            if kind == "spare" and settled and not self._stewards.busy(job):
                await demand.withdraw(key)
            elif (
                kind == HOLD
                and not self._stewards.busy(job)
                and (res is None or len(res.spares) >= res.spec.spares)
            ):
                await demand.withdraw(key)  # every spare held, or fewer wanted now

    async def _clear_intent(self, job: str) -> None:
        async def step() -> None:
            res = self._state.get(job)
            if res is not None and res.applying is not None:
                try:
                    await self._records.applying(res, None)
                except Exception as e:
                    log.info("clearing the apply intent of %r: %s", job, e)

        await self._stewards.run(job, Trigger.CLEAR_INTENT, step)

    async def _finish_release(self, job: str) -> None:
        async def step() -> None:
            res = self._state.get(job)
            if res is not None and res.state in (PENDING, RELEASING):
                await self._reserver.release_in_step(job)

        try:
            await self._stewards.run(job, Trigger.FINISH_RELEASE, step)
        except Exception as e:
            log.info("finishing the release of %r: %s", job, e)

    def _warm_nodes(self) -> None:
        # One idle worker per node answers that node's probes; starting it off the
        # reserve path saves a worker start per node. Only nodes with something left to
        # reserve are warmed, at most warm_budget per tick, each once per warm_period.
        now = core.now()
        period = self.settings.warm_period
        held: dict[str, int] = {}
        for res in self._state.records.values():
            for slot in (*res.slots, *res.spares):
                held[slot.node_id] = held.get(slot.node_id, 0) + len(slot.bundles)
        budget = self.settings.warm_budget
        doubted = set(self._nodes.in_doubt())  # a task there would wait on its silence
        alive = self._nodes.alive_ids() - doubted
        for node_id in sorted(alive, key=lambda n: self._warmed.get(n, 0.0)):
            if budget == 0 or now - self._warmed.get(node_id, -period) < period:
                break
            info = self._nodes.info(node_id)
            if info is None or not _reservable(info, held.get(node_id, 0)):
                continue
            self._io.warm(node_id)
            self._warmed[node_id] = now
            budget -= 1


class Finding(enum.StrEnum):
    """What a pass of the loop finds a reservation asks for. Each has one answer
    (:meth:`Reconciler._answers`); a broken slot's cause, recorded by the check, says
    where the repair puts it (``controller.state.causes.RESPONSES``)."""

    LEAVING_DUE = "leaving-due"  # an old slot whose time is up, its node gone or back
    INTENT_LEFT = "intent-left"  # an apply's intent its apply could not clear
    BROKEN = "broken"  # recorded degraded, with automatic repair
    ON_DRAINING = "on-draining"  # ready, with a slot on a draining node
    SPARES_DUE = "spares-due"  # held spares to take, drop or replace
    CUT_SHORT = "cut-short"  # a reservation or a release cut short


LEAVING_DUE, INTENT_LEFT, BROKEN, ON_DRAINING, SPARES_DUE, CUT_SHORT = Finding


def findings(
    res: ReservationRecord,
    draining: set[str],
    nodes: Container[str],
    now: float,
    spares_due: bool,
    away: Container[str] = frozenset(),
) -> list[Finding]:
    """What ``res`` asks for now, given the draining nodes, the nodes alive (``nodes``),
    the wall clock, whether its held spares are due (the holder's word) and the nodes in
    doubt (``away``): old slots to drop, then at most one of the others, the first that
    holds, in this order."""
    out = []
    if any(x.due(now, nodes, away) for x in res.leaving):
        out.append(LEAVING_DUE)
    if res.applying is not None:
        out.append(INTENT_LEFT)
    elif res.state == DEGRADED and res.repair == AUTO:
        out.append(BROKEN)
    elif res.state == READY and res.repair == AUTO and draining & res.node_ids():
        out.append(ON_DRAINING)
    elif spares_due:
        out.append(SPARES_DUE)
    elif res.state in (PENDING, RELEASING):
        out.append(CUT_SHORT)
    return out


def _reservable(info: NodeInfo, bundles_held: int) -> bool:
    """Whether a new reservation could still use the node: it has accelerators or custom
    resources that placectl's own bundles do not already fill."""
    units = sum(
        v
        for k, v in info.resources.items()
        if k not in ("CPU", "memory", "object_store_memory")
        and not k.startswith(("node:", "accelerator_type:"))
    )
    return units > bundles_held
