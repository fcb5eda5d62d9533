"""Reserve, cancel and release.

A new reservation is recorded ``pending`` before any group exists, its groups are
created (paced) and placed on their pinned nodes, probed, and its master ports leased;
the ``ready`` record and its published assignments are written in one commit. A failure
or a cancel removes everything the attempt made and forgets the record. A release is
recorded ``releasing`` before any group is removed and is done only when Ray reports
every group gone.

It changes records only through the state owner, in steps of the job's steward,
and keeps to itself the reserves in flight (so that a release or cancel can stop them)
and the timings of the last one.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import msgspec

from controller.errors import (
    ReservationCancelled,
    ReservationConflict,
    ReservationError,
)
from controller.planning.components import ComponentPlacement, choose_floating_nodes
from controller.planning.spec_edit import describe_difference
from controller.runtime import core
from controller.runtime.core import groups, to_the_end
from controller.runtime.core.context import Context
from controller.runtime.core.stewards import Trigger
from controller.runtime.edge import node_tasks
from controller.runtime.steps.admission import ADMIT, Admitter
from controller.runtime.steps.checks import Checker
from controller.runtime.steps.leasing import Leaser
from controller.runtime.steps.repair import Repairer
from controller.state.change import Caller
from controller.state.plan import JobPlan, plan_slots
from controller.state.published import publish
from controller.state.queueing import Terms
from controller.state.records import AUTO, PENDING, QUEUED, READY, RELEASING, ReservationRecord
from controller.state.table import StoredPlan

log = logging.getLogger("placectl.controller")
NO_TERMS = Terms()


class Reserver:
    """``reserve``, ``cancel``, ``release``; see the module docstring."""

    def __init__(self, ctx: Context, checker: Checker, leaser: Leaser, repairer: Repairer) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self._stewards = ctx.stewards
        self._records = ctx.records
        self._claims = ctx.claims
        self._checker = checker
        self._leaser = leaser
        self._repairer = repairer
        self._progress = ctx.progress
        self._incarnation = ctx.incarnation
        self.settings = ctx.settings
        self._prefix = ctx.prefix
        self._tasks = ctx.tasks
        self._demand = ctx.demand
        # The queue: it places what it admits and releases what it preempts through this
        # reserver, which owns both.
        self.admitter = Admitter(ctx, self.place_admitted, checker.wake, self.release)
        self.last_timings: dict[str, float] = {}

    def in_progress(self, job: str) -> bool:
        return self._tasks.get("reserve", job) is not None

    # ------------------------------------------------------------ reserve
    async def reserve(
        self,
        job: str,
        spec: Any,
        timeout: float,
        replace: bool,
        policy: str,
        terms: Terms = NO_TERMS,
        caller: Caller | None = None,
    ) -> ReservationRecord:
        """Reserve ``spec`` for ``job`` (arguments checked by the caller); its record.

        The same job and spec returns the existing reservation without creating anything
        (its repair policy updated), checked against Ray's node table first: one that
        holds a node Ray reports dead is repaired before it is returned (``auto``
        policy, within the timeout) or returned ``degraded`` (``manual``). A different
        spec is a :class:`ReservationConflict` unless ``replace``. On timeout, failure or
        cancellation every group made for the attempt is removed and nothing is
        recorded.

        With a queue in ``terms``, a reservation that does not fit now, or that others are queued
        before, is recorded ``queued`` and placed whole when its turn comes (see
        :mod:`controller.state.queueing`); on timeout or cancellation it leaves the queue.
        """
        started = core.now()
        await self._checker.confirm([job])

        async def step() -> ReservationRecord | None:
            existing = self._state.get(job)
            if existing is not None and existing.state == QUEUED:
                queued = await self.admitter.rejoin(existing, spec, terms)
                if queued is not None:
                    return await self._reserve_in_step(job, spec, started, timeout, policy, queued)
                existing = None
            same = existing is not None and existing.settled and existing.spec == spec
            if same:
                if existing.repair != policy:
                    existing = await self._records.policy(existing, policy)
                if self._checker.truthful(existing).state == READY or policy != AUTO:
                    return existing
                return None  # the same spec, degraded under the auto policy: repaired below
            if existing is not None and existing.settled and replace and caller:
                caller.may(existing, "replace")
            if existing is not None and existing.settled and not replace:
                raise ReservationConflict(
                    f"job {job!r} is already reserved with a different configuration "
                    f"({describe_difference(existing.spec, spec)}); release it first or "
                    "pass replace=True"
                )
            if existing is not None:
                await self.release_in_step(job)
            queued = await self.admitter.enqueue(job, spec, policy, terms) if terms.queue else None
            return await self._reserve_in_step(job, spec, started, timeout, policy, queued, terms)

        res = await self._stewards.run(job, Trigger.RESERVE, step)
        if res is not None:
            return res
        return await self._repairer.repair_until(job, started + timeout)

    async def _reserve_in_step(
        self,
        job: str,
        spec,
        started: float,
        timeout: float,
        policy: str,
        queued: ReservationRecord | None = None,
        terms: Terms = NO_TERMS,
    ) -> ReservationRecord:
        self._tasks.adopt("reserve", job)
        try:
            if queued is not None:
                await self.admitter.wait_turn(queued, started + timeout)
            while True:
                try:
                    res = await self._create(job, spec, started + timeout, policy, queued, terms)
                    break
                except groups.NodeLost as e:  # rolled back: plan again on the live nodes
                    log.warning("reserve of %r: %s; planning again", job, e)
                    self._progress.say(job, f"{e}; planning again")
        except asyncio.CancelledError:
            if self._incarnation.dead:
                raise
            raise ReservationCancelled(
                f"reserve of {job!r} was cancelled; everything it had placed was removed"
            ) from None
        finally:
            self._tasks.drop("reserve", job)
            self._progress.clear(job)
            if queued is not None:
                self.admitter.done(job)
        self._io.metrics.reserve_latency(core.now() - started)
        return res

    async def place_admitted(self, job: str) -> None:
        """Place an admitted reservation whose caller is not waiting (a controller
        restart took the call), in a step of its steward; queued again if that fails."""

        async def step() -> None:
            queued = self._state.get(job)
            if queued is None or queued.state != QUEUED:
                return
            self._tasks.adopt("reserve", job)
            deadline = core.now() + self.settings.admitted_place_timeout
            try:
                await self._create(job, queued.spec, deadline, queued.repair, queued)
            except Exception as e:
                log.warning("placing admitted reservation %r failed: %s; queued again", job, e)
                why = f"admitted, but placing it failed ({e}); queued again"
                if (now := self._state.get(job)) is not None and now.state == QUEUED:
                    await self._records.explained(now, why)
            finally:
                self._tasks.drop("reserve", job)
                self._progress.clear(job)

        try:
            await self._stewards.run(job, Trigger.PLACE_ADMITTED, step)
        finally:
            self.admitter.done(job)

    async def cancel(self, job: str) -> bool:
        """Cancel a ``reserve`` of ``job`` in progress (it rolls back); True if there was
        one. An existing reservation is not touched."""
        task = self._tasks.get("reserve", job)
        if task is None:
            return False
        task.cancel()
        await self._stewards.settled(job, Trigger.CANCEL)  # after the reserve's rollback
        return True

    async def _free(self, job: str) -> dict[str, dict[str, float]]:
        """Ray's free resources less what other steps claimed (a repair's spare, a
        reservation admitted and not yet placed: controller.runtime.core.claims), but
        what admission claimed for ``job`` itself."""
        return self._claims.free(await self._io.free_resources(), but=f"{ADMIT}/{job}")

    async def _create(
        self,
        job: str,
        spec,
        deadline: float,
        policy: str,
        queued: ReservationRecord | None = None,
        terms: Terms = NO_TERMS,
    ) -> ReservationRecord:
        entered = core.now()
        before = self._state.get(job)  # none, or this job's queued record
        say = lambda m: self._progress.say(job, m)  # noqa: E731
        view = await groups.wait_for_nodes(
            self._io, self._nodes, job, spec, deadline, say, self._demand
        )
        floating_groups = [g for g in spec.node_groups if g.floating]
        floating = (
            choose_floating_nodes(spec, view, floating_groups, await self._free(job))
            if floating_groups
            else {}
        )
        plan = JobPlan.of(ComponentPlacement(spec, view, floating))
        uid = secrets.token_hex(6)
        epoch = self._state.epoch(job) + 1
        nodes = {nr: view.nodes[nr] for nr in plan.node_ranks()}
        record = ReservationRecord(
            job=job,
            uid=uid,
            epoch=epoch,
            spec=spec,
            nodes=nodes,
            floating=floating,
            slots=plan_slots(plan, spec, nodes, f"{self._prefix}{job}:{uid[:6]}:"),
            world_sizes=plan.world_sizes(),
            state=PENDING,
            repair=policy,
            created_at=core.wall(),
            queued_at=queued.queued_at if queued else 0.0,
            **msgspec.structs.asdict(Terms.of(queued) if queued else terms),
        )
        groups.refuse_if_it_never_fits(self._nodes, f"reservation {job!r}", record.slots)
        stored = StoredPlan(job=job, uid=uid, epoch=epoch, plan=plan)
        crash_point = self._incarnation.crash_point
        crash_point("after_plan")
        await self._records.created(record, before, plan=stored)
        pending = record
        created: dict[int, str] = {}
        holds: list = []
        try:
            t0 = core.now()
            slots = await groups.create_and_wait(
                self._io,
                job,
                record.slots,
                deadline,
                say,
                created,
                held_by=lambda node: self._state.jobs_on(node) - {job},
                dead=lambda node: not self._nodes.alive(node),
            )
            crash_point("after_create")
            record = msgspec.structs.replace(record, slots=slots)
            crash_point("after_ready")
            t1 = core.now()
            say("probing accelerator ids")
            slots = await groups.probe(self._io, job, slots, spec.accelerator, deadline)
            record = msgspec.structs.replace(record, slots=slots)
            crash_point("after_probe")
            t2 = core.now()
            record = await self._leaser.lease_masters(record, plan, holds)
            published = publish(record, plan)  # node-group env clashes surface here
            ready = msgspec.structs.replace(record, state=READY)
            await self._records.placed(ready, pending, published)
            self.last_timings = {
                "plan_s": round(t0 - entered, 6),
                "place_s": round(t1 - t0, 6),
                "probe_s": round(t2 - t1, 6),
            }
        except BaseException as e:
            if not self._incarnation.dead:
                await self._rollback(record, pending, created)
            raise e
        finally:
            self._leaser.drop_holds(holds)
        crash_point("after_write")
        log.info(
            "reserved %r: %d node slots, %d accelerators", job, len(slots), ready.accelerators()
        )
        return ready

    async def _rollback(self, record, pending: ReservationRecord, created: dict) -> None:
        """Undo a reservation that did not complete (``record`` as far as it got,
        ``pending`` as written), to the end: the caller runs in the job's step, and no
        cancel (a release and a cancel of the job at once send two) may release it while
        the undo still writes."""

        async def undo() -> None:
            ids = set(created.values()) | record.group_ids()
            names = {s.group_name for s in record.slots}
            ids |= await groups.ids_by_name(self._io, names)  # made, never recorded
            left = await groups.remove_verified(self._io, ids, self.settings.removal_timeout)
            if left:
                why = f"rolling back: groups {sorted(left)} remain"
                await self._records.releasing(pending, why)
                return
            await self._records.forgotten(record.job)

        try:
            await to_the_end(undo())
        except Exception:
            log.exception("rolling back %r failed; the reconcile loop finishes it", record.job)

    # ------------------------------------------------------------ release
    async def release_in_step(self, job: str) -> bool:
        """Release ``job`` (the caller runs in a step of its steward); True if there was a
        record."""
        res = self._state.get(job)
        if res is None:
            return False
        if res.state != RELEASING:
            res = await self._records.releasing(res, "releasing")
        self._incarnation.crash_point("release_after_mark")
        ids = res.group_ids()
        if any(not s.group_id for s in res.slots):  # cut short before ids were recorded
            ids |= await groups.ids_by_name(self._io, {s.group_name for s in res.slots})
        timeout = self.settings.removal_timeout
        left = await groups.remove_verified(self._io, ids, timeout)
        self._incarnation.crash_point("release_after_remove")
        if left:
            why = f"Ray still reports placement group(s) {sorted(left)}; retrying"
            await self._records.explained(res, why)
            raise ReservationError(
                f"release of {job!r} is not complete: Ray still reports placement group(s) "
                f"{sorted(left)} after {timeout:g}s; placectl keeps removing "
                "them and drops the reservation once they are gone"
            )
        await self._records.forgotten(job)
        await self._demand.withdraw_job(job)
        self.admitter.wake()
        log.info("released %r", job)
        # The workers went with their groups; a daemon one of them started did not. The
        # record goes first: the sweep waits out Ray's own workers (seconds), and the
        # reservation is over once its groups are (a waiting job is admitted meanwhile).
        await node_tasks.end_on_nodes(
            self._io,
            res.uid,
            job,
            {s.node_id for s in res.slots if s.node_id},
            self.settings.leftovers_timeout,
        )
        return True

    async def release(self, job: str, caller: Caller | None = None) -> bool:
        """Remove ``job``'s groups and record; True if there was one. Idempotent. A
        ``reserve`` of the same job still in progress is cancelled first. Returns only
        once Ray reports every group gone."""
        task = self._tasks.get("reserve", job)
        if task is not None:
            task.cancel()

        async def step() -> bool:
            if caller is not None and (res := self._state.get(job)) is not None:
                caller.may(res, "release")
            return await self.release_in_step(job)

        return await self._stewards.run(job, Trigger.RELEASE, step) or task is not None
