"""Repair: a reservation whose node died, was suspected, or whose group vanished, gets
that slot back on a node of the same kind, while its other slots, their groups and their
workers are left alone; and the drain's move, make before break. This is the file to
open to change when a lost node is replaced; how is :mod:`controller.runtime.steps.replacing`.

It changes records only in a step of the job's steward (see
:mod:`controller.runtime.core.stewards`); the steps of different jobs run at once, each
claiming the room it chooses (:mod:`controller.runtime.core.claims`). It keeps to itself
what is in flight: the repair tasks and when each job may be tried again.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from controller.errors import NotOwner, ReservationTimeout
from controller.runtime import core
from controller.runtime.core import doubts, groups
from controller.runtime.core.context import Context
from controller.runtime.core.inbox import Kind, Source
from controller.runtime.core.stewards import Trigger
from controller.runtime.steps.checks import Checker
from controller.runtime.steps.leasing import Leaser
from controller.runtime.steps.replacing import Replacer
from controller.state.change import Caller
from controller.state.published import publish
from controller.state.records import (
    DEGRADED,
    MANUAL,
    READY,
    UNTIL_BACK,
    LeavingGroup,
    ReservationRecord,
)

log = logging.getLogger("placectl.controller")


class Repairer:
    """Automatic repair of degraded reservations, and ``repair(job)`` on request."""

    def __init__(self, ctx: Context, checker: Checker, leaser: Leaser) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self._stewards, self._records = ctx.stewards, ctx.records
        self._checker, self._leaser = checker, leaser
        self._progress, self._incarnation = ctx.progress, ctx.incarnation
        self.settings, self._prefix = ctx.settings, ctx.prefix
        self._tasks, self._demand = ctx.tasks, ctx.demand
        self._after: dict[str, float] = {}  # job -> when it may be tried again
        self._replacer = Replacer(ctx, leaser)

    # ------------------------------------------------------------ entry points
    async def repair(self, job: str, caller: Caller | None = None) -> None:
        """Replace the broken slots of a degraded reservation now, whatever its repair
        policy. A node Ray reports dead counts as broken even before the loop has
        seen it.

        Raises:
            NotOwner: ``caller`` may not change it.
        """
        self._state.require(job)
        await self._checker.confirm([job])
        await self._run(job, caller)

    async def repair_until(self, job: str, deadline: float) -> ReservationRecord:
        """Repair ``job`` until it is ready (as Ray reports its nodes) or ``deadline``.

        Raises:
            ReservationTimeout: still degraded at the deadline; the reservation stays,
                and the loop repairs it when a spare node joins.
        """
        try:
            while True:
                await self._run(job)
                await self._checker.confirm([job])
                res = self._checker.truthful(self._state.require(job))
                if res.state == READY:
                    return res
                left = deadline - core.now()
                if left <= 0:
                    raise ReservationTimeout(
                        f"reservation {job!r} is degraded and was not repaired in time: "
                        f"{res.reason}. It stays reserved; placectl replaces the slot when "
                        "a spare node joins"
                    )
                self._progress.say(job, f"repairing: {res.reason}")
                await asyncio.sleep(min(0.2, left))
        finally:
            self._progress.clear(job)

    def schedule(self, job: str) -> None:
        """Repair ``job`` in the background, unless one runs or it waits to retry."""
        if core.now() >= self._after.get(job, 0.0):
            self._tasks.start("repair", job, self._run(job))

    def schedule_move(self, job: str) -> None:
        """Move ``job``'s slots off draining nodes in the background (see :meth:`move`),
        unless a move or repair of it runs or it waits to retry."""
        if core.now() >= self._after.get(job, 0.0):
            self._tasks.start("move", job, self.move(job))

    async def move(self, job: str) -> None:
        """Move the slots of ``job`` on draining nodes to spares before the nodes go,
        make before break: the replacement is placed, probed and published first (epoch
        + 1, the reservation ``ready`` throughout), and each old group stays, leaving,
        until its node's deadline (or ``drain_grace`` when the drain named none), so the
        workers in it finish their step and move at a boundary of the job's choosing
        (``WorkerGroup.sync()``). Without a spare the reason says so and the slot stays;
        if the node then goes, the repair takes over as after any loss."""
        try:

            async def step() -> tuple[ReservationRecord, set[str]] | None:
                res, draining = self._state.get(job), self._nodes.draining
                if res is None or res.state != READY or not res.node_ids() & set(draining):
                    return None
                holds: list = []
                try:
                    await self._demand.settle(f"spare/{job}")
                    new, why, stale, want = await self._replacer.replace(res, holds, draining)
                    await self._demand.want(f"spare/{job}", want)
                    if new is not None:
                        now = core.wall()
                        leaving = [
                            LeavingGroup(
                                group_id=s.group_id,
                                node_id=s.node_id,
                                remove_at=draining[s.node_id] or now + self.settings.drain_grace,
                            )
                            for s in res.slots
                            if s.node_id in draining and s.group_id
                        ]
                        new = msgspec.structs.replace(new, leaving=[*res.leaving, *leaving])
                        plan = (await self._state.plan(job)).plan
                        previous = await self._state.published(job)
                        published = publish(new, plan, previous=previous)
                        await self._records.placed(new, res, published)
                        stale -= {x.group_id for x in leaving}
                finally:
                    self._leaser.drop_holds(holds)
                    self._replacer.done(job)
                if new is None:
                    self._after[job] = core.now() + self.settings.repair_retry
                    if why and why != res.reason:
                        log.warning("reservation %r stays where it is: %s", job, why)
                        await self._records.explained(res, why)
                    return None
                return new, stale

            moved = await self._stewards.run(job, Trigger.MOVE, step)
            if moved is None:
                return
            new, stale = moved
            log.warning("reservation %r moved off draining node(s) (epoch %d)", job, new.epoch)
            await groups.remove_verified(self._io, stale, self.settings.removal_timeout)
        except Exception:
            log.exception("moving %r off draining nodes failed; will try again", job)
            self._after[job] = core.now() + self.settings.repair_retry

    async def drop_leaving(self, job: str) -> None:
        """Remove the leaving groups of ``job`` whose time came (their deadline passed,
        or their node is gone), and forget them."""

        async def step() -> None:
            res, now = self._state.get(job), core.wall()
            away = set(self._nodes.in_doubt())
            due = [
                x for x in (res.leaving if res is not None else []) if x.due(now, self._nodes, away)
            ]
            if not due:
                return
            try:
                left = await groups.remove_verified(
                    self._io, {x.group_id for x in due}, self.settings.removal_timeout
                )
                keep = [x for x in res.leaving if x not in due or x.group_id in left]
                await self._records.left_behind(res, keep)
            except Exception as e:
                log.warning("removing the groups %r left on draining nodes: %s", job, e)

        await self._stewards.run(job, Trigger.DROP_LEAVING, step)

    def _keep_while_away(
        self, old: ReservationRecord, new: ReservationRecord, stale: set[str]
    ) -> tuple[ReservationRecord, set[str]]:
        """``new`` keeping, as leaving until their node answers again or is gone, the old
        groups of slots that moved off a suspect (:class:`LeavingGroup`: nothing is sent
        to a node that is away); the stale groups left to remove now."""
        away = self._nodes.suspected()
        kept = [
            LeavingGroup(group_id=s.group_id, node_id=s.node_id, remove_at=UNTIL_BACK)
            for s in old.slots
            if s.group_id in stale and s.node_id in away
        ]
        if not kept:
            return new, stale
        new = msgspec.structs.replace(new, leaving=[*new.leaving, *kept])
        return new, stale - {x.group_id for x in kept}

    def _moved_off_doubt(self, old: ReservationRecord, new: ReservationRecord) -> None:
        """Tell the node view which nodes in doubt ``old``'s slots left: what its ranks
        left there is ended when such a node answers again (or goes with it)."""
        kept = {s.node_id for s in new.slots}
        for node in {s.node_id for s in old.slots} - kept:
            if self._nodes.phase(node) in doubts.OPEN and self._nodes.alive(node):
                self._nodes.say(node, Kind.MOVED, Source.REPAIR, detail=old.uid)

    def retry_now(self) -> None:
        """A node joined: a spare may have arrived, so nobody waits to retry."""
        self._after.clear()

    def making(self) -> set[str]:
        """The names of the groups repairs are making right now."""
        return self._replacer.making()

    # ------------------------------------------------------------ one repair
    async def _run(self, job: str, caller: Caller | None = None) -> None:
        try:

            async def step() -> set[str] | None:  # the old groups, removed after the step
                res = self._state.get(job)
                if res is not None and caller is not None:
                    caller.may(res, "repair")
                if res is None or res.state != DEGRADED:
                    return None
                holds: list = []
                try:
                    await self._demand.settle(f"spare/{job}")
                    new, why, stale, want = await self._replacer.replace(res, holds)
                    await self._demand.want(f"spare/{job}", want)
                    if new is not None:
                        new, stale = self._keep_while_away(res, new, stale)
                        plan = (await self._state.plan(job)).plan
                        previous = await self._state.published(job)
                        published = publish(new, plan, previous=previous)
                        await self._records.placed(new, res, published)
                        self._moved_off_doubt(res, new)
                finally:
                    self._leaser.drop_holds(holds)
                    self._replacer.done(job)
                if new is None:
                    self._after[job] = core.now() + self.settings.repair_retry
                    if res.repair == MANUAL and why:
                        why += f"; repair policy is manual: run `placectl repair {job}`"
                    if why and why != res.reason:
                        log.warning("reservation %r stays degraded: %s", job, why)
                        await self._records.explained(res, why)
                    return None
                self._after.pop(job, None)
                self._incarnation.crash_point("replace_after_write")
                return stale

            stale = await self._stewards.run(job, Trigger.REPAIR, step)
            if stale is None:
                return
            left = await groups.remove_verified(self._io, stale, self.settings.removal_timeout)
            if left:
                log.warning("old groups of %r not removed yet: %s", job, sorted(left))
        except NotOwner:
            raise
        except Exception:
            log.exception("repairing %r failed; will try again", job)
            self._after[job] = core.now() + self.settings.repair_retry
