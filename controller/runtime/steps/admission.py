"""The queue: when each queued reservation may be placed.

Fault-tolerance contract: the queue is the ``queued`` records in the table, each written
before its ``reserve`` starts to wait; its order (priority, arrival) is in those records;
quotas are in the table too. Only the waiting calls themselves live in memory. A
controller that restarts finds the queue in the table and admits from it; a queued
reservation whose caller is gone is placed by the controller itself, and its caller (or a
later ``reserve`` of the same spec) finds it ready. Decisions are pure
(:mod:`controller.state.queueing`); this class gathers their inputs (the plan of each
entry on the live nodes, what Ray reports free, what each queue holds) and acts on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

import msgspec

from controller.errors import PlacementError, ReservationTimeout
from controller.planning.components import ComponentPlacement, choose_floating_nodes
from controller.runtime import core
from controller.runtime.core import groups, to_the_end
from controller.runtime.core.context import Context
from controller.runtime.core.stewards import Trigger
from controller.state import queueing
from controller.state.plan import JobPlan, plan_slots
from controller.state.records import QUEUED, ReservationRecord

log = logging.getLogger("placectl.controller")
ADMIT = "admit"  # who claims an admitted reservation's nodes until it is placed: admit/<job>
RECHECK_PERIOD_S = 2.0  # a pass also runs this often: others' actors come and go unseen


class Admitter:
    """Admits queued reservations in order as the cluster frees up.

    Args:
        ctx: the controller's shared parts (a preemption's grace is its settings').
        place: starts placing a queued reservation whose caller is not waiting (after a
            controller restart), given its job name.
        poke: wakes the controller's loop, which runs :meth:`tick`.
        release: releases a reservation (a preempted one, at its deadline).
    """

    def __init__(
        self,
        ctx: Context,
        place: Callable[[str], Awaitable[None]],
        poke: Callable[[], None],
        release: Callable[[str], Awaitable[bool]],
    ) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self._stewards = ctx.stewards
        self._claims = ctx.claims
        self._records = ctx.records
        self._progress = ctx.progress
        self._prefix = ctx.prefix
        self._tasks = ctx.tasks
        self._incarnation = ctx.incarnation
        self._place = place
        self._poke = poke
        self._release = release
        self._grace = ctx.settings.preempt_grace
        self._waiters: dict[str, asyncio.Event] = {}
        self._admitted: dict[str, dict[str, dict[str, float]]] = {}  # not yet placed
        self._plans: dict[tuple[str, str], tuple[object, dict]] = {}  # (job, uid) -> view, needs
        self._dirty = True
        self._last = 0.0
        self.last_decision = queueing.Decision()
        self.last_pass_s = 0.0  # placectl's own time in the last pass (no Ray calls)

    def forget_plans(self) -> None:
        """Plan every queued entry again at the next pass, as if none had been kept (the
        queue benchmark's baseline)."""
        self._plans.clear()

    def wake(self) -> None:
        """Something changed (a release, a join, a new entry): decide again, at the
        loop's next turn, which this brings forward."""
        self._dirty = True
        self._poke()

    def queued(self) -> list[ReservationRecord]:
        """The queued records, in admission order."""
        records = [r for r in self._state.records.values() if r.state == QUEUED]
        return sorted(records, key=lambda r: (-r.priority, r.queued_at, r.job))

    def wants(self, job: str) -> dict[str, float]:
        """What a queued job asks for in total, from its last plan ({} if none yet)."""
        for (j, _), (_, needs) in self._plans.items():
            if j == job:
                return queueing.Entry(job=j, queue="", needs=needs).total()
        return {}

    def why(self, job: str) -> tuple[int, str] | None:
        """``(position, reason)`` of a waiting job as of the last pass."""
        return self.last_decision.waiting.get(job)

    async def tick(self) -> None:
        """Release preempted reservations whose deadline passed; run a pass if something
        changed or the recheck period passed."""
        now, queued = core.wall(), False
        for res in list(self._state.records.values()):  # one pass per tick
            if res.preempt_at and res.preempt_at <= now:
                self._tasks.start("release preempted", res.job, self._release_preempted(res.job))
            queued = queued or res.state == QUEUED
        if not queued:
            return
        if self._dirty or core.now() - self._last >= RECHECK_PERIOD_S:
            await self.admit()

    async def admit(self) -> queueing.Decision:
        """Decide once, and let the admitted reservations go."""
        self._dirty = False
        self._last = core.now()
        # Less what other steps claimed: a repair's spare or a reservation admitted
        # earlier, its group not made yet (controller.runtime.core.claims).
        free = self._claims.free(await self._io.free_resources())
        started = time.perf_counter()
        records = self.queued()
        entries = [self._entry(r, free) for r in records]
        decision = queueing.decide(
            entries,
            free,
            quotas=self._state.quotas,
            used=self._used(),
            name=self._name,
            holders=lambda node_id: self._state.jobs_on(node_id),
            holdings=self._holdings(),
        )
        self.last_pass_s = time.perf_counter() - started
        self.last_decision = decision
        needs = {e.job: e.needs for e in entries}
        for job in decision.admitted:
            self._admitted[job] = needs[job] or {}
            for node_id, amounts in self._admitted[job].items():  # until it is placed
                self._claims.claim(f"{ADMIT}/{job}", node_id, amounts)
            waiter = self._waiters.get(job)
            log.info("admitting queued reservation %r", job)
            if waiter is not None:
                waiter.set()
            else:
                self._tasks.start("place", job, self._place(job))
        for job, waiter in decision.preempt.items():
            # Its step waits for the job's steward in a task of its own, never in this pass.
            self._tasks.start("preempt", job, self._preempt(job, waiter))
        for job, (pos, why) in decision.waiting.items():
            self._progress.say(job, f"queued: position {pos} of {len(records)}: {why}")
        return decision

    async def _preempt(self, job: str, waiter: str) -> None:
        """Give a preemptible reservation its deadline (written to the table, where its
        drivers and workers read it), once whatever is changing it now is done."""

        async def step() -> None:
            res = self._state.get(job)
            if res is None or res.preempt_at or not res.preemptible or not res.slots:
                return
            grace = res.preempt_grace or self._grace
            deadline = core.wall() + grace
            at = time.strftime("%H:%M:%S", time.localtime(deadline))
            reason = f"preempted for {waiter!r}: released at {at}"
            await self._records.preempted(res, deadline, reason)
            log.warning("preempting %r for %r: released in %.0fs", job, waiter, grace)

        try:
            await self._stewards.run(job, Trigger.PREEMPT, step)
        except Exception as e:
            log.warning("preempting %r failed: %s; the next pass decides again", job, e)
        finally:
            self.wake()

    async def _release_preempted(self, job: str) -> None:
        res = self._state.get(job)
        if res is None or not res.preempt_at:
            return
        try:
            await self._release(job)
            log.warning("released preempted reservation %r", job)
        except Exception as e:
            log.warning("releasing preempted %r failed: %s; retrying", job, e)
        finally:
            self.wake()

    def _holdings(self) -> list[queueing.Holding]:
        """The placed reservations, as preemption sees them: what each holds on each
        node, its held spares included."""
        out = []
        for res in self._state.records.values():
            if res.state == QUEUED or not res.slots:
                continue
            # Its held spares leave with it: whole nodes a waiting job may need.
            held = (*res.slots, *res.spares)
            needs = queueing.needs_by_node((s.node_id, s.need()) for s in held)
            out.append(
                queueing.Holding(
                    job=res.job,
                    priority=res.priority,
                    preemptible=res.preemptible,
                    needs=needs,
                    leaving=bool(res.preempt_at),
                )
            )
        return out

    def done(self, job: str) -> None:
        """A reservation admitted (or cancelled) finished placing: its resources now
        show in what Ray reports free, or were given back."""
        self._admitted.pop(job, None)
        self._claims.release(f"{ADMIT}/{job}")
        for key in [k for k in self._plans if k[0] == job]:
            del self._plans[key]
        self.wake()

    async def enqueue(
        self, job: str, spec, policy: str, terms: queueing.Terms
    ) -> ReservationRecord:
        """Record ``job`` queued (nothing is placed). What could never fit the cluster
        as it is is refused first, naming what is missing, and nothing is written."""
        view = self._nodes.view(spec.accelerator)
        if view.num_nodes >= spec.num_nodes and not any(g.floating for g in spec.node_groups):
            plan = JobPlan.of(ComponentPlacement(spec, view))
            nodes = {nr: view.nodes[nr] for nr in plan.node_ranks()}
            slots = plan_slots(plan, spec, nodes, self._prefix)
            groups.refuse_if_it_never_fits(self._nodes, f"reservation {job!r}", slots)
        now = core.wall()
        record = ReservationRecord(
            job=job,
            uid=secrets.token_hex(6),
            epoch=self._state.epoch(job),
            spec=spec,
            state=QUEUED,
            reason=f"queued in {terms.queue!r}",
            repair=policy,
            created_at=now,
            queued_at=now,
            **msgspec.structs.asdict(terms),
        )
        await self._records.created(record, self._state.get(job))
        log.info("queued %r in %r at priority %d", job, terms.queue, terms.priority)
        self.wake()
        return record

    async def rejoin(
        self, queued: ReservationRecord, spec, terms: queueing.Terms
    ) -> ReservationRecord | None:
        """A ``reserve`` of a job already queued: with the same spec it waits in the same
        place (its queue, priority and preemptibility updated if asked; its owner kept);
        with another, the old entry leaves the queue and None is returned."""
        if queued.spec != spec:
            await self._records.forgotten(queued.job)
            return None
        asked = {"queue": terms.queue or queued.queue, "priority": terms.priority}
        asked["preemptible"] = terms.preemptible
        if any(getattr(queued, k) != v for k, v in asked.items()):
            changed = await self._records.terms(queued, asked)
            queued = changed
        return queued

    async def wait_turn(self, record: ReservationRecord, deadline: float) -> None:
        """Wait until ``record``'s job is admitted. A reservation that leaves the queue
        instead (timeout, cancellation) takes its record with it.

        Raises:
            ReservationTimeout: not admitted before ``deadline``.
        """
        try:
            await self._wait(record, deadline)
        except BaseException:
            current = self._state.get(record.job)
            mine = current is not None and current.state == QUEUED and current.uid == record.uid
            if mine and not self._incarnation.dead:  # a crashed controller's calls change nothing
                await to_the_end(self._records.forgotten(record.job))
            raise

    async def _wait(self, record: ReservationRecord, deadline: float) -> None:
        job = record.job
        event = self._waiters.setdefault(job, asyncio.Event())
        self.wake()
        try:
            while not event.is_set():
                remaining = deadline - core.now()
                if remaining <= 0:
                    pos, why = self.why(job) or (0, "not decided yet")
                    raise ReservationTimeout(
                        f"reservation {job!r} was not admitted in time: it was number {pos} "
                        f"in the queue ({why}); it left queue {record.queue!r}"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=min(remaining, 1.0))
        finally:
            self._waiters.pop(job, None)

    # ------------------------------------------------------------ inputs
    def _entry(self, res: ReservationRecord, free: dict) -> queueing.Entry:
        spec = res.spec
        base = {"job": res.job, "queue": res.queue, "priority": res.priority}
        view = self._nodes.view(spec.accelerator)
        if view.num_nodes < spec.num_nodes:
            why = f"waiting for nodes: {view.num_nodes} of {spec.num_nodes} alive"
            return queueing.Entry(**base, queued_at=res.queued_at, why=why)
        floating_groups = [g for g in spec.node_groups if g.floating]
        # A plan depends on the nodes only (without floating groups), and the live view
        # is the same object for as long as Ray reports the same nodes.
        cached = self._plans.get((res.job, res.uid))
        if cached is not None and cached[0] is view and not floating_groups:
            return queueing.Entry(**base, queued_at=res.queued_at, needs=cached[1])
        try:
            floating = (
                choose_floating_nodes(spec, view, floating_groups, free) if floating_groups else {}
            )
            plan = JobPlan.of(ComponentPlacement(spec, view, floating))
        except PlacementError as e:
            return queueing.Entry(**base, queued_at=res.queued_at, why=str(e))
        nodes = {nr: view.nodes[nr] for nr in plan.node_ranks()}
        slots = plan_slots(plan, spec, nodes, self._prefix)
        needs = queueing.needs_by_node((s.node_id, s.need()) for s in slots)
        self._plans[(res.job, res.uid)] = (view, needs)
        return queueing.Entry(**base, queued_at=res.queued_at, needs=needs)

    def _used(self) -> dict[str, dict[str, float]]:
        """What each queue's placed (and admitted, not yet placed) reservations hold,
        their held spares included."""
        held: dict[str, list[dict[str, float]]] = {}
        for res in self._state.records.values():
            if res.queue:
                mine = held.setdefault(res.queue, [])
                if res.state == QUEUED:
                    mine.extend(self._admitted.get(res.job, {}).values())
                else:  # held spares count against the quota as its slots do
                    mine.extend(s.need() for s in (*res.slots, *res.spares))
        return {queue: queueing.add_up(needs) for queue, needs in held.items()}

    def _name(self, node_id: str) -> str:
        info = self._nodes.info(node_id)
        return f"node {info.ip} ({node_id[:12]})" if info is not None else f"node {node_id[:12]}"


__all__ = ["Admitter"]
