"""Slot replacement: a reservation whose node died, or whose group vanished, gets that
slot back on a node of the same kind, while its other slots, their groups and their
workers are left alone. This is the file to open to change how a lost node is replaced.

It changes records only in a step of the job's steward, holding the spare choice while
it does (see :mod:`controller.runtime.core.stewards`), and keeps to itself what is in
flight: the repair tasks, when each job may be tried again, and the names of the groups
it is making (which the orphan sweep must leave alone).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import msgspec

from controller.errors import NotOwner, ReservationTimeout
from controller.runtime import core
from controller.runtime.core import groups
from controller.runtime.core.context import Context
from controller.runtime.core.stewards import Trigger
from controller.runtime.edge import CREATED
from controller.runtime.steps.checks import Checker
from controller.runtime.steps.leasing import Leaser
from controller.state import spares
from controller.state.change import Caller
from controller.state.published import publish
from controller.state.records import (
    DEGRADED,
    DRAIN,
    MANUAL,
    OWN_NODE,
    READY,
    RESPONSES,
    LeavingGroup,
    ReservationRecord,
)
from controller.state.wants import Want, for_spare

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
        # Names of replacement groups being made: not in the table until the new record
        # is written, and not orphans meanwhile (a restart removes them by prefix).
        self._making: dict[str, set[str]] = {}

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
                    new, why, stale, want = await self._replace_slots(res, holds, draining)
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
                    self._making.pop(job, None)
                if new is None:
                    self._after[job] = core.now() + self.settings.repair_retry
                    if why and why != res.reason:
                        log.warning("reservation %r stays where it is: %s", job, why)
                        await self._records.explained(res, why)
                    return None
                return new, stale

            async with self._stewards.spares:  # each move sees what the last one took
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
            due = [
                x
                for x in (res.leaving if res is not None else [])
                if x.remove_at <= now or x.node_id not in self._nodes
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

    def retry_now(self) -> None:
        """A node joined: a spare may have arrived, so nobody waits to retry."""
        self._after.clear()

    def making(self) -> set[str]:
        """The names of the groups repairs are making right now."""
        return {n for made in self._making.values() for n in made}

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
                    new, why, stale, want = await self._replace_slots(res, holds)
                    await self._demand.want(f"spare/{job}", want)
                    if new is not None:
                        plan = (await self._state.plan(job)).plan
                        previous = await self._state.published(job)
                        published = publish(new, plan, previous=previous)
                        await self._records.placed(new, res, published)
                finally:
                    self._leaser.drop_holds(holds)
                    self._making.pop(job, None)
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

            async with self._stewards.spares:  # each repair sees what the last one took
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

    async def _replace_slots(
        self, res: ReservationRecord, holds: list, draining: dict[str, float] | None = None
    ) -> tuple[ReservationRecord | None, str, set[str], Want | None]:
        """A new record with every broken slot replaced (epoch + 1, master ports
        re-leased where they lived), the reason when there is none, the old group ids
        to remove once the new record is written, and, when lost slots have no spare,
        the nodes to ask the autoscaler for. With ``draining`` (a move), the slots on
        those nodes are replaced too, on other nodes. ``res`` is never changed, and on
        failure every group made for the attempt is removed. New master ports stay held
        in ``holds`` until the caller has written the record. A lost node's slots go to
        a held spare of their shape first (``cluster.spares``): nothing to place."""
        await self._nodes.refresh()
        table = await self._io.groups(sorted(res.group_ids()))
        found = groups.broken_slots(res, table, self._nodes)
        moving = {i for i, s in enumerate(res.slots) if s.node_id in (draining or {})}
        broken = sorted(set(found) | moving)
        if not broken:
            if draining is None:
                await self._records.ready(res)
            return None, "", set(), None
        live = self._nodes.view(res.spec.accelerator)
        live_by_id = {n.node_id: n for n in live.nodes}
        placed = {g for g, info in table.items() if info.state == CREATED}
        usable = spares.usable_spares(res, live_by_id, self._nodes.draining, placed)
        adopted: dict[int, list[int]] = {}  # held spare -> the slots it becomes
        free = await self._io.free_resources()
        taken = {s.node_id for i, s in enumerate(res.slots) if i not in broken}
        # Where each goes is its cause's (controller.state.records.RESPONSES). A lost
        # node's slots (several after an apply grew it) move together, as one slot on
        # one spare.
        parts: list[tuple[Any, list[int]]] = []
        lost: dict[int, list[int]] = {}
        for i in broken:
            slot = res.slots[i]
            cause = found[i].cause if i in found else DRAIN
            if RESPONSES[cause].replace_on == OWN_NODE and slot.node_id in live_by_id:
                parts.append((live_by_id[slot.node_id], [i]))
            else:
                lost.setdefault(slot.node_rank, []).append(i)
        plan = (await self._state.plan(res.job)).plan if lost else None
        why, short = "", []  # the first reason, and every lost node without a spare
        for node_rank, idxs in sorted(lost.items()):
            keep = spares.segments_kept(res.spec, plan, node_rank, res.nodes[node_rank])
            bundles = [b for i in idxs for b in res.slots[i].bundles]
            sel = spares.selectors_for(res, node_rank)
            dead = res.nodes[node_rank]
            held = spares.held_for(res, dead, bundles, usable, taken, sel, keep)
            if held is not None:
                taken.add(res.spares[held].node_id)
                adopted[held] = idxs
                continue
            need = spares.need_of(bundles)
            spare = spares.choose_spare(
                res.nodes[node_rank], live.nodes, free, need, taken, sel, keep
            )
            if spare is None:
                first = res.slots[idxs[0]]
                wants = ", ".join(f"{k} {v:g}" for k, v in sorted(need.items()))
                where = "".join(f" {k.describe()}" for k in keep)
                lost_how = "is on draining node" if idxs[0] in moving else "lost node"
                why = why or (
                    f"slot {idxs[0]} (node rank {node_rank}) {lost_how} {first.node_ip} "
                    f"({first.node_id[:12]}); no spare node of the same kind with {wants} "
                    f"free{where}; waiting for one to join"
                )
                short.append((res.nodes[node_rank], [res.slots[i] for i in idxs]))
                continue
            taken.add(spare.node_id)
            parts.append((spare, idxs))
        if short:
            wants = [for_spare(slots, node, live, res.spec.accelerator) for node, slots in short]
            want = Want(groups=[g for w in wants for g in w.groups], why=wants[0].why)
            return None, f"{why}; asked the autoscaler for {want.describe()}", set(), want
        self._incarnation.crash_point("replace_after_plan")
        token = secrets.token_hex(3)
        fresh = [
            msgspec.structs.replace(
                res.slots[idxs[0]],
                node_id=target.node_id,
                node_ip=target.ip,
                group_name=f"{self._prefix}{res.job}:{token}:{k}",
                group_id="",
                bundles=[
                    msgspec.structs.replace(b, physical_id=-1, uuid="", pci_bus_id="")
                    for i in idxs
                    for b in res.slots[i].bundles
                ],
            )
            for k, (target, idxs) in enumerate(parts)
        ]
        took = [  # held spares made slots: placed and probed already
            msgspec.structs.replace(res.spares[j], node_rank=res.slots[idxs[0]].node_rank)
            for j, idxs in adopted.items()
        ]
        await self._demand.withdraw(f"spare/{res.job}")  # it must not take the spares
        created: dict[int, str] = {}
        deadline = core.now() + self.settings.repair_timeout
        self._making[res.job] = {s.group_name for s in fresh}
        try:
            fresh = await groups.create_and_wait(
                self._io,
                res.job,
                fresh,
                deadline,
                lambda m: None,
                created,
                self.settings.max_in_flight,
            )
            self._incarnation.crash_point("replace_after_create")
            fresh = await groups.probe(self._io, res.job, fresh, res.spec.accelerator, deadline)
            self._incarnation.crash_point("replace_after_probe")
            nodes = dict(res.nodes)
            moved = set()
            parts += [(usable[res.spares[j].node_id], idxs) for j, idxs in adopted.items()]
            for target, idxs in parts:
                old = res.slots[idxs[0]]
                nodes[old.node_rank] = target
                if old.node_id != target.node_id:
                    moved.add(old.node_id)
            gone = {i for _, idxs in parts for i in idxs}
            slots = sorted(
                [s for i, s in enumerate(res.slots) if i not in gone] + fresh + took,
                key=lambda s: s.node_rank,
            )
            masters = sorted(
                {x.component for x in res.leases if x.purpose == "master" and x.node_id in moved}
            )
            new = msgspec.structs.replace(
                res,
                nodes=nodes,
                slots=slots,
                leases=[x for x in res.leases if x.node_id not in moved],
                cores=[x for x in res.cores if x.node_id not in moved],
                spares=[s for j, s in enumerate(res.spares) if j not in adopted],
                epoch=res.epoch + 1,
                state=READY,
                reason="",
            )
            plan = (await self._state.plan(res.job)).plan
            new = spares.settle_standby_leases(new, plan)  # a promoted standby's: its rank's
            new = await self._leaser.lease_masters(new, plan, holds, masters)
        except BaseException as e:
            if self._incarnation.dead:
                raise
            await groups.remove_verified(
                self._io, set(created.values()), self.settings.removal_timeout
            )
            if isinstance(e, Exception):
                return None, f"replacing slots {broken} failed, will retry: {e}", set(), None
            raise
        log.warning("reservation %r: replaced slots %s (epoch %d)", res.job, broken, new.epoch)
        return new, "", {res.slots[i].group_id for i in broken} - {""}, None
