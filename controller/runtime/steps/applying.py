"""Apply a new configuration to a live reservation.

Which slots stay, go and come is decided by :mod:`controller.state.change`; this module
makes it happen in the order that keeps the old reservation whole until the new one is:

1. the intent (the names of the groups to make) is written to the record;
2. new slots are created and placed; a slot that remakes bundles of a removed slot on a
   node without room for both waits for that slot's removal (a rebuild);
3. new slots are probed, master ports re-leased where a component's rank 0 moved;
4. the new record (epoch + 1), plan and assignments are written in one commit;
5. the slots no longer used are removed.

A failure or timeout before 4 removes what was made and clears the intent: the
reservation is exactly as before (a rebuilt slot that was already removed is made again
by the repair, as a slot whose group vanished). A controller that restarts with an
intent clears it the same way; its groups are orphans.

It changes records only through the state owner, in a step of the job's steward.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import msgspec

from controller.errors import ReservationError
from controller.planning.components import ComponentPlacement, choose_floating_nodes
from controller.planning.spec_edit import with_component
from controller.runtime import core
from controller.runtime.core import groups
from controller.runtime.core.context import Context
from controller.runtime.core.stewards import Trigger
from controller.runtime.steps.checks import Checker
from controller.runtime.steps.leasing import Leaser
from controller.state.change import ApplySummary, Caller, Change, bound_view, plan_slots_change
from controller.state.leases import MASTER
from controller.state.plan import JobPlan
from controller.state.published import publish
from controller.state.queueing import add_up, quota_excess
from controller.state.records import READY, Applying, ReservationRecord
from controller.state.table import StoredPlan

log = logging.getLogger("placectl.controller")


def _fits(free: dict[str, float], need: dict[str, float]) -> bool:
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in need.items())


class Applier:
    """``apply`` and ``resize``; see the module docstring."""

    def __init__(self, ctx: Context, checker: Checker, leaser: Leaser) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self._stewards = ctx.stewards
        self._records = ctx.records
        self._claims = ctx.claims
        self._checker = checker
        self._leaser = leaser
        self._progress = ctx.progress
        self._incarnation = ctx.incarnation
        self.settings = ctx.settings
        self._prefix = ctx.prefix

    async def apply(
        self, job: str, spec: Any, timeout: float, dry_run: bool, caller: Caller | None = None
    ) -> ApplySummary:
        """Give the live reservation ``job`` the configuration ``spec`` (arguments checked
        by the caller), touching only what changes; what changed (or would).

        Slots whose bundles are unchanged keep their groups and devices; ranks whose
        placement is unchanged keep their assignments byte for byte (master ports
        included, unless their component's rank 0 moved). The epoch goes up by one. All
        or nothing: if the new slots cannot be placed by the timeout, the reservation
        stays as it was. The same spec again changes nothing. ``dry_run`` only says what
        would change.

        Raises:
            UnknownReservation: no reservation named ``job``.
            NotOwner: ``caller`` may not change it.
            ReservationError: it is not ready, or the change could not be placed.
            PlacementError: the configuration is invalid or does not fit the cluster.
        """
        return await self._apply(job, lambda _: spec, timeout, dry_run, caller, "apply")

    async def resize(
        self,
        job: str,
        component: str,
        placement: str | None,
        node_group: str | list[str] | None,
        timeout: float,
        dry_run: bool,
        caller: Caller | None = None,
    ) -> ApplySummary:
        """Apply ``job``'s configuration with one component placed anew: a new placement
        string (``rollout`` from ``0-7`` to ``0-15``), other node groups (a move between
        groups), or both; edited from the configuration current in the job's step, so
        a concurrent apply is never reverted. See :meth:`apply`."""
        self._state.require(job)

        def edit(current: Any) -> Any:
            return with_component(current, component, placement, node_group)

        return await self._apply(job, edit, timeout, dry_run, caller, "resize")

    async def _apply(self, job, edit, timeout, dry_run, caller, what) -> ApplySummary:
        await self._checker.confirm([job])

        async def step() -> ApplySummary:
            started = core.now()
            res = self._state.require(job)
            if caller is not None:
                caller.may(res, what)
            spec = edit(res.spec)
            if res.spec == spec:
                return ApplySummary(
                    job=job,
                    epoch=res.epoch,
                    applied=not dry_run,
                    note="the reservation already has this configuration",
                )
            if res.state != READY:
                why = f": {res.reason}" if res.reason else ""
                raise ReservationError(
                    f"apply to {job!r} needs a ready reservation; it is {res.state}{why}"
                )
            if spec.accelerator != res.spec.accelerator:
                raise ReservationError(
                    f"apply cannot change the accelerator ({res.spec.accelerator} -> "
                    f"{spec.accelerator}); reserve with replace=True instead"
                )
            change, floating = await self._change(res, spec)
            kept = [res.slots[i] for i in change.kept]
            groups.refuse_if_it_never_fits(self._nodes, f"apply to {job!r}", change.created, kept)
            self._refuse_over_quota(res, [*kept, *change.created])
            if dry_run:
                return change.summary
            new = await self._apply_change(res, spec, change, floating, started + timeout)
            summary = msgspec.structs.replace(change.summary, applied=True, epoch=new.epoch)
            log.warning(
                "applied a new configuration to %r (epoch %d): %d slots kept, %d made, %d removed",
                job,
                new.epoch,
                summary.slots_kept,
                summary.slots_created,
                summary.slots_removed,
            )
            return summary

        return await self._stewards.run(job, Trigger.APPLY, step)

    def _refuse_over_quota(self, res: ReservationRecord, slots: list) -> None:
        """An apply may not take a queued reservation's queue past its quota."""
        limit = self._state.quotas.get(res.queue) if res.queue else None
        if not limit:
            return
        others = [
            s
            for other in self._state.records.values()
            if other.queue == res.queue and other.job != res.job
            for s in other.slots
        ]
        used, wants = add_up(s.need() for s in others), add_up(s.need() for s in slots)
        over = quota_excess(limit, used, wants)
        if over:
            shown = ", ".join(f"{k} {v:g} (quota {limit[k]:g})" for k, v in sorted(over.items()))
            raise ReservationError(
                f"apply to {res.job!r} would take queue {res.queue!r} to {shown}; nothing "
                "was changed (placectl quota raises it)"
            )

    async def _change(self, res: ReservationRecord, spec) -> tuple[Change, dict]:
        await self._nodes.refresh()
        view = bound_view(res, self._nodes.view(spec.accelerator))
        old_groups = {g.label: g for g in res.spec.node_groups}
        floating, choose = {}, []
        for g in spec.node_groups:
            if not g.floating:
                continue
            if old_groups.get(g.label) == g and g.label in res.floating:
                floating[g.label] = res.floating[g.label]
            else:
                choose.append(g)
        if choose:  # less what other steps claimed (controller.runtime.core.claims)
            free = self._claims.free(await self._io.free_resources())
            floating = choose_floating_nodes(spec, view, choose, free, kept=floating)
        plan = JobPlan.of(ComponentPlacement(spec, view, floating))
        old_plan = (await self._state.plan(res.job)).plan
        prefix = f"{self._prefix}{res.job}:{secrets.token_hex(3)}:"
        return plan_slots_change(res, old_plan, plan, view, prefix), floating

    async def _apply_change(
        self,
        res: ReservationRecord,
        spec,
        change: Change,
        floating: dict,
        deadline: float,
    ) -> ReservationRecord:
        job = res.job
        crash_point = self._incarnation.crash_point
        epoch = max(res.epoch, self._state.epoch(job)) + 1
        previous = await self._state.published(job)
        intent = Applying(epoch=epoch, group_names=[s.group_name for s in change.created])
        current = await self._records.applying(res, intent)
        crash_point("apply_after_intent")
        free = await self._io.free_resources()
        first, later = [], []
        for c, slot in enumerate(change.created):
            room = free.get(slot.node_id, {})
            (later if c in change.rebuilt and not _fits(room, slot.need()) else first).append(c)
        made: dict[int, Any] = {}
        created: dict[int, str] = {}
        removed_early: set[str] = set()
        holds: list = []
        say = lambda m: self._progress.say(job, m)  # noqa: E731
        try:
            for batch in (first, later):
                if not batch:
                    continue
                if batch is later:
                    removed_early = {
                        res.slots[i].group_id for c in later for i in change.rebuilt[c]
                    } - {""}
                    marked = msgspec.structs.replace(intent, removed=sorted(removed_early))
                    current = await self._records.applying(current, marked)
                    left = await groups.remove_verified(
                        self._io, removed_early, self.settings.removal_timeout
                    )
                    if left:
                        raise ReservationError(
                            f"apply to {job!r}: the slots it rebuilds were not removed in "
                            f"time ({sorted(left)})"
                        )
                    crash_point("apply_after_rebuild_removal")
                got: dict[int, str] = {}
                placed = await groups.create_and_wait(
                    self._io,
                    job,
                    [change.created[c] for c in batch],
                    deadline,
                    say,
                    got,
                    self.settings.max_in_flight,
                )
                created.update({batch[k]: gid for k, gid in got.items()})
                made.update(zip(batch, placed, strict=True))
            crash_point("apply_after_create")
            say("probing accelerator ids")
            fresh = [made[c] for c in range(len(change.created))]
            fresh = await groups.probe(self._io, job, fresh, spec.accelerator, deadline)
            crash_point("apply_after_probe")
            new = await self._applied_record(res, spec, change, floating, fresh, epoch, holds)
            published = publish(new, change.plan, previous=previous)
            stored = StoredPlan(job=job, uid=res.uid, epoch=epoch, plan=change.plan)
            await self._records.placed(new, current, published, plan=stored)
        except BaseException:
            if self._incarnation.dead:
                raise
            await self._undo_apply(res, current, set(created.values()), intent, bool(removed_early))
            raise
        finally:
            self._leaser.drop_holds(holds)
            self._progress.clear(job)
        crash_point("apply_after_write")
        gone = {c for c in previous.components if c not in new.world_sizes}
        if gone:
            try:
                await self._state.drop_components(job, sorted(gone))
            except Exception as e:  # stale keys no record lists; harmless
                log.info("removing the assignments of %s: %s", sorted(gone), e)
        old = {res.slots[i].group_id for i in change.removed} - removed_early - {""}
        left = await groups.remove_verified(self._io, old, self.settings.removal_timeout)
        if left:
            log.warning("slots %r no longer uses are not removed yet: %s", job, sorted(left))
        return new

    async def _applied_record(
        self,
        res: ReservationRecord,
        spec,
        change: Change,
        floating: dict,
        fresh: list,
        epoch: int,
        holds: list,
    ) -> ReservationRecord:
        """The record after the apply: kept and new slots, leases carried over where
        their node and component remain, master ports leased where rank 0 moved."""
        kept = [res.slots[i] for i in change.kept]
        slots = sorted(kept + fresh, key=lambda s: s.node_rank)  # stable: kept first
        plan = change.plan
        nodes_now = {s.node_id for s in slots}
        rank0 = {c.name: change.nodes[c.placements[0].node_rank].node_id for c in plan.components}
        leases = []
        for x in res.leases:
            if x.standby is not None:  # a standby's, on a held spare the apply keeps
                if x.component in rank0:
                    leases.append(x)
                continue
            if x.component not in rank0 or x.node_id not in nodes_now:
                continue
            if x.purpose == MASTER and x.node_id != rank0[x.component]:
                continue
            leases.append(x)
        has_master = {x.component for x in leases if x.purpose == MASTER}
        sizes = plan.world_sizes()
        # A core lease stays where its rank still runs on its node; a rank that moves
        # leases on its new node when it starts there.
        where = {
            (c.name, p.rank): change.nodes[p.node_rank].node_id
            for c in plan.components
            for p in c.placements
        }
        cores = [
            x
            for x in res.cores
            if where.get((x.component, x.rank)) == x.node_id
            or (x.standby is not None and x.component in rank0)
        ]
        new = msgspec.structs.replace(
            res,
            spec=spec,
            nodes=change.nodes,
            floating=floating,
            slots=slots,
            world_sizes=sizes,
            epoch=epoch,
            state=READY,
            reason="",
            leases=leases,
            cores=cores,
            applying=None,
        )
        missing = [c.name for c in plan.components if c.name not in has_master]
        if missing:
            new = await self._leaser.lease_masters(new, plan, holds, missing)
        return new

    async def _undo_apply(
        self,
        res: ReservationRecord,
        current: ReservationRecord,
        created: set[str],
        intent: Applying,
        rebuilt: bool,
    ) -> None:
        ids = created | await groups.ids_by_name(self._io, set(intent.group_names))
        left = await groups.remove_verified(self._io, ids, self.settings.removal_timeout)
        if left:
            log.warning("apply to %r rolled back; groups %s not removed yet", res.job, left)
        try:
            await self._records.applying(current, None)
        except Exception as e:
            log.warning("apply to %r rolled back; clearing its intent failed: %s", res.job, e)
        if rebuilt:
            self._checker.recheck(res.job)  # its removed slots are made again by the repair
