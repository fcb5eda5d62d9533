"""What Ray and the node view say about the reservations: node events, direct questions
about a job's nodes, and the state (ready or degraded) each settled reservation is
recorded in.

The loop's ticks and the calls that answer about a reservation both come here, so
"ready" means the same thing everywhere: no node of the reservation is dead as Ray
reports it or suspected by placectl, and (at a check with Ray's group table) every group
is CREATED.
"""

from __future__ import annotations

import asyncio
import logging

from controller.runtime import core
from controller.runtime.core import groups
from controller.runtime.core.context import Context
from controller.runtime.core.inbox import Fact, Kind, Source
from controller.runtime.core.stewards import Trigger
from controller.runtime.edge import GroupInfo
from controller.state.records import DEGRADED, MANUAL, READY, ReservationRecord, with_dead_nodes

log = logging.getLogger("placectl.controller")
# Facts after which a node may hold room it did not: one joined, one came back (swept),
# a cordon or a drain lifted.
_ROOM = frozenset({Kind.JOINED, Kind.SWEPT, Kind.ANSWERED, Kind.UNCORDONED, Kind.UNDRAINED})


class Checker:
    """Keeps each settled reservation's recorded state in line with Ray and with what the
    node view believes of its nodes.

    It owns the jobs waiting to be checked again (found while another call held them, or
    on a node a fact changed) and the loop's wake-up: the node view's inbox (a fact
    posted), Ray's node events, and a call that found work.
    """

    def __init__(self, ctx: Context) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self._stewards = ctx.stewards
        self._records = ctx.records
        self._recheck: set[str] = set()
        self._room = False  # room may have appeared since the last take_room()
        self._wakeup = asyncio.Event()

    # ------------------------------------------------------------ what to look at
    def recheck(self, job: str) -> None:
        """Check ``job`` again at the next tick."""
        self._recheck.add(job)

    def take_rechecks(self) -> set[str]:
        jobs, self._recheck = self._recheck, set()
        return jobs

    def take_room(self) -> bool:
        """Whether a node joined or came back to placement since the last call (a
        repair waiting for a spare tries again at once)."""
        room, self._room = self._room, False
        return room

    def wake(self) -> None:
        self._wakeup.set()

    async def idle(self, period: float) -> None:
        """Wait for the next tick: ``period``, or less when a fact is posted, a node
        event arrives or a call found work (a lost node is acted on at once)."""
        inbox = self._nodes.inbox.wakeup
        waits = {
            asyncio.ensure_future(self._io.wait_for_events(period)),
            asyncio.ensure_future(self._wakeup.wait()),
            asyncio.ensure_future(inbox.wait()),
        }
        try:
            await asyncio.wait(waits, timeout=period, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            self._wakeup.clear()

    async def drain_events(self) -> None:
        """Post Ray's node events to the node view's inbox."""
        for event in await self._io.node_events():
            kind = Kind.JOINED if event.alive else Kind.DIED
            self._nodes.say(event.node_id, kind, Source.RAY_EVENT)

    def follow_up(self) -> list[Fact]:
        """The loop's one follow-up on node facts, whoever posted or settled them:
        settle the inbox, and check again at this tick every job on a node a fact
        changed. Returns the facts applied since the last follow-up."""
        self._nodes.inbox.wakeup.clear()
        self._nodes.settle()
        facts = self._nodes.take_applied()
        for fact in facts:
            self._recheck.update(self._state.jobs_on(fact.node))
            if fact.kind in _ROOM:
                self._room = True
        return facts

    # ------------------------------------------------------------ answers
    def truthful(self, res: ReservationRecord) -> ReservationRecord:
        """``res`` as it stands with the nodes known dead or suspected."""
        nodes = res.node_ids()
        dead = {n for n in nodes if not self._nodes.alive(n)}
        return with_dead_nodes(res, dead, nodes & self._nodes.suspected())

    async def confirm(self, jobs) -> None:
        """Make what the controller answers about ``jobs`` agree with Ray right now.

        Node events that arrived are posted, and the nodes these jobs hold are asked of
        Ray directly (one round trip for all of them; the answers posted as facts taken
        when the question left), so no call answers ``ready`` for a reservation on a
        node Ray reports dead, even in the moment before the loop has seen the event. A
        job found on a dead or suspected node is recorded degraded here unless another
        call holds it (the answer says so anyway, see :meth:`truthful`), and the loop is
        woken to repair it.
        """
        await self.drain_events()
        held = [r for j in jobs if (r := self._state.get(j)) is not None and r.settled]
        nodes = sorted({n for r in held for n in r.node_ids()})
        if not nodes:
            self._nodes.settle()
            return
        sent = core.now()
        dead = await self._io.dead_nodes(nodes)
        for node in nodes:
            kind = Kind.DIED if node in dead else Kind.JOINED
            self._nodes.post(Fact(node=node, kind=kind, source=Source.RAY_READ, when=sent))
        self._nodes.settle()
        broken = {n for n in nodes if not self._nodes.alive(n)} | self._nodes.suspected()
        for res in held:
            if not res.node_ids() & broken:
                continue
            self.recheck(res.job)
            self.wake()
            if res.state == READY and not self._stewards.busy(res.job):
                await self.check(res.job, await self._io.groups(sorted(res.group_ids())))

    async def check(self, job: str, table: dict[str, GroupInfo]) -> None:
        """Record a settled reservation ready or degraded by what Ray reports (``table``:
        Ray's entries of its groups). A new verdict is a change of the job's record, so
        it is a step of the job's steward, posted only when the steward is idle (a job
        a step is changing is checked again at the next tick instead) and only when the
        verdict differs from the record: a check that changes nothing is a read."""
        if self._stewards.busy(job):
            self.recheck(job)
            return
        if self._verdict(job, table) is None:
            return

        async def step() -> None:
            verdict = self._verdict(job, table)  # again: on the record current now
            if verdict is None:
                return
            res, state, reason, cause = verdict
            try:
                await self._records.judged(res, state, reason, cause)
            except Exception as e:
                self.recheck(job)  # memory is unchanged: try again next tick
                log.warning("could not record that %r is %s: %s", job, state, e)
                return
            log.warning("reservation %r is now %s %s", job, state, reason)

        await self._stewards.run(job, Trigger.CHECK, step)

    def _verdict(
        self, job: str, table: dict[str, GroupInfo]
    ) -> tuple[ReservationRecord, str, str, str] | None:
        """The record of ``job`` and its new state, reason and cause by ``table``; None
        when there is nothing to change."""
        res = self._state.get(job)
        if res is None or not res.settled:
            return None
        suspected = self._nodes.suspected()
        found = list(groups.broken_slots(res, table, self._nodes, suspected).values())
        state, reason = (DEGRADED, "; ".join(b.why for b in found)) if found else (READY, "")
        cause = found[0].cause if found else ""
        if state == res.state == DEGRADED:
            return None  # while degraded, the repair owns the reason
        if state == READY and res.preempt_at:
            reason = res.reason  # the deadline's explanation stays until release
        if state == DEGRADED and res.repair == MANUAL:
            reason += f"; repair policy is manual: run `placectl repair {job}`"
        if (state, reason, cause) == (res.state, res.reason, res.cause):
            return None
        return res, state, reason, cause
