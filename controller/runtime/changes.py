"""The controller's calls that change something: a reservation, a queue or a node.

**Reservations**: ``reserve``, ``cancel``,
``release``, ``release_all``, ``apply``, ``resize``, ``repair`` and port leases. A change
to a reservation another owns is refused unless forced (:mod:`controller.state.change`),
and every change is signed in the history with its caller.

**Queues**: what waits and why, each queue's quota and use,
who may change quotas, and the event history.

**Nodes** an operator takes out of placement: ``cordon``
(with ``drain``, its slots move off too), ``uncordon`` and ``cordons``
(:mod:`controller.state.records`).
"""

from __future__ import annotations

import contextlib
import logging

import msgspec

from controller.errors import NotOwner, ReservationError
from controller.runtime import core
from controller.runtime.core.history import acting_as, client
from controller.runtime.core.inbox import Source
from controller.runtime.reads import status_bytes
from controller.runtime.steps import Operations
from controller.state.change import Caller, check_owner, owner_hash, owns
from controller.state.lease_requests import LeaseCores, LeasePorts, ReleasePorts
from controller.state.published import QueueEntry
from controller.state.queueing import Terms, usage
from controller.state.records import Cordon, resolve
from controller.state.requests import (
    Apply,
    CordonNode,
    EventsSince,
    Everyone,
    JobOf,
    Owned,
    Reserve,
    Resize,
    SetOperator,
    SetQuota,
    UncordonNode,
)

log = logging.getLogger("placectl.controller")


class ChangeCalls:
    """Answers the calls that change reservations, each given its checked request."""

    def __init__(self, ops: Operations) -> None:
        self._ops = ops
        self._state = ops.ctx.state

    def _owns(self, job: str, token: str, force: bool, what: str) -> Caller:
        """The caller of ``what`` on ``job``, refused at once when the record as it
        stands is another's and ``force`` is not given. The operation checks again,
        authoritatively, against the record it reads in the job's step (and logs a
        forced change there)."""
        caller = Caller(token, force)
        res = self._state.get(job)
        if res is not None:
            check_owner(res, token, force, what)
        return caller

    async def reserve(self, call: Reserve) -> bytes:
        """Reserve the resources of ``spec`` for ``job`` (in ``queue`` at ``priority``,
        if given), owned by ``token``'s holder; returns the encoded status (see
        :meth:`Reserver.reserve`). Replacing another's spec needs its token or ``force``."""
        caller = self._owns(call.job, call.token, call.force, "replace") if call.replace else None
        terms = Terms(
            queue=call.queue,
            priority=call.priority,
            owner=owner_hash(call.token),
            preemptible=call.preemptible,
            preempt_grace=call.preempt_grace_s,
        )
        with acting_as(client(terms.owner, call.force)):
            res = await self._ops.reserver.reserve(
                call.job, call.spec, call.timeout_s, call.replace, call.repair, terms, caller
            )
        return status_bytes(self._ops.checker, res)

    async def cancel(self, call: JobOf) -> bool:
        """Cancel a ``reserve`` of ``job`` in progress; True if there was one."""
        return await self._ops.reserver.cancel(call.job)

    async def release(self, call: Owned) -> bool:
        """Remove ``job``'s reservation; True if there was one (see :meth:`Reserver.release`)."""
        caller = self._owns(call.job, call.token, call.force, "release")
        with acting_as(client(owner_hash(call.token), call.force)):
            return await self._ops.reserver.release(call.job, caller)

    async def release_all(self, call: Everyone) -> list[str]:
        """Release every reservation the caller owns (every one with ``force``); returns
        the jobs released."""
        jobs = [j for j, r in self._state.records.items() if call.force or owns(r, call.token)]
        if call.force:
            log.warning("release of every reservation forced (%d)", len(jobs))
        caller, released = Caller(call.token, call.force), []
        for job in sorted(jobs):
            # NotOwner: reserved anew by another client meanwhile
            with (
                contextlib.suppress(NotOwner),
                acting_as(client(owner_hash(call.token), call.force)),
            ):
                if await self._ops.reserver.release(job, caller):
                    released.append(job)
        return released

    async def apply(self, call: Apply) -> bytes:
        """Give the live reservation ``job`` the configuration ``spec``, touching only
        what changes; returns the encoded :class:`ApplySummary` (see :meth:`Applier.apply`
        for what it keeps and what it raises)."""
        caller = self._owns(call.job, call.token, call.force, "apply")
        with acting_as(client(owner_hash(call.token), call.force)):
            summary = await self._ops.applier.apply(
                call.job, call.spec, call.timeout_s, call.dry_run, caller
            )
        return msgspec.msgpack.encode(summary)

    async def resize(self, call: Resize) -> bytes:
        """:meth:`apply` with one component placed anew (see :meth:`Applier.resize`)."""
        caller = self._owns(call.job, call.token, call.force, "resize")
        with acting_as(client(owner_hash(call.token), call.force)):
            summary = await self._ops.applier.resize(
                call.job,
                call.component,
                call.placement,
                call.node_group,
                call.timeout_s,
                call.dry_run,
                caller,
            )
        return msgspec.msgpack.encode(summary)

    async def repair(self, call: Owned) -> bytes:
        """Replace the broken slots of a degraded reservation now, whatever its repair
        policy; returns its status (still degraded, with the reason, if it could not).
        A node of the job whose raylet refuses connections is fenced first."""
        caller = self._owns(call.job, call.token, call.force, "repair")
        res = self._state.get(call.job)
        if res is not None and res.settled:
            await self._ops.liveness.check_now(res.node_ids())
        with acting_as(client(owner_hash(call.token), call.force)):
            await self._ops.repairer.repair(call.job, caller)
        return status_bytes(self._ops.checker, self._state.require(call.job))

    async def lease_ports(self, call: LeasePorts) -> list[int]:
        """Lease ``count`` ports on the node of ``component``'s ``rank`` (see
        :meth:`Leaser.lease_ports`)."""
        caller = self._owns(call.job, call.token, call.force, "a port lease")
        return await self._ops.leaser.lease_ports(
            call.job,
            call.component,
            call.rank,
            call.count,
            call.consecutive,
            call.name,
            call.request_id,
            caller,
            call.standby,
        )

    async def lease_cores(self, call: LeaseCores) -> dict[str, int | str]:
        """Lease CPU units of its node for ``component``'s ``rank`` (see
        :meth:`CoreLeaser.lease_cores`): the run and the node's total."""
        caller = self._owns(call.job, call.token, call.force, "a core lease")
        lease = await self._ops.core_leaser.lease_cores(
            call.job, call.component, call.rank, call.name, caller, call.standby
        )
        return {
            "node_id": lease.node_id,
            "first": lease.first,
            "count": lease.count,
            "node_cpus": lease.node_cpus,
        }

    async def release_ports(self, call: ReleasePorts) -> int:
        """End the leases holding any of ``ports``; returns how many."""
        caller = self._owns(call.job, call.token, call.force, "a port release")
        return await self._ops.leaser.release_ports(call.job, call.ports, caller)


class QueueCalls:
    """Answers ``queue``, ``set_quota``, ``set_operator``, ``quotas``, ``queues`` and
    ``events``, each given its checked request."""

    def __init__(self, ops: Operations) -> None:
        self._admitter = ops.admitter
        self._state = ops.ctx.state

    async def queue(self) -> bytes:
        """Encoded ``list[QueueEntry]``: every queued reservation in admission order,
        with what it asks for and why it waits, as of the last decision."""
        out = []
        for i, res in enumerate(self._admitter.queued(), start=1):
            position, why = self._admitter.why(res.job) or (i, "not decided yet")
            out.append(
                QueueEntry(
                    position=position,
                    job=res.job,
                    queue=res.queue,
                    priority=res.priority,
                    queued_at=res.queued_at,
                    wants=self._admitter.wants(res.job),
                    why=why,
                )
            )
        return msgspec.msgpack.encode(out)

    async def set_quota(self, call: SetQuota) -> dict[str, float]:
        """Set ``queue``'s quota (resource -> the most its admitted reservations may hold
        together; ``{}`` removes it), written to the table before it applies. Reservations
        already admitted keep their resources; the next admissions respect it.

        Args:
            token: the operator's token (see :meth:`set_operator`).
            force: change it without the operator's token (signed so in the history).

        Raises:
            NotOwner: ``token`` is not the operator's and ``force`` is not given.
        """
        refused = f"changing the quota of {call.queue!r} refused"
        forced = operator_may(self._state.operator, call.token, call.force, refused)
        with acting_as(client(owner_hash(call.token), forced)):
            await self._state.set_quota(call.queue, call.limits)
        self._admitter.wake()
        return call.limits

    async def set_operator(self, call: SetOperator) -> str:
        """Make ``token`` the operator's: quota changes then need it (or ``force``).
        Returns the first characters of its hash, as the history shows it.

        Raises:
            NotOwner: another operator token is set and ``force`` is not given.
        """
        hashed = owner_hash(call.token)
        current = self._state.operator
        if current and current != hashed and not call.force:
            raise NotOwner(
                "setting the operator token refused: another one is set; give the current "
                "operator's token or --force to replace it"
            )
        if current != hashed:
            with acting_as(client(hashed, bool(current))):
                await self._state.set_operator(hashed)
        return hashed[:8]

    async def quotas(self) -> dict[str, dict[str, float]]:
        """Every queue's quota."""
        return {q: dict(v) for q, v in self._state.quotas.items()}

    async def queues(self) -> bytes:
        """Encoded ``list[QueueUsage]``: every queue's quota beside what its placed
        reservations hold and how many wait (``""``: reservations made without a queue,
        which no quota limits)."""
        return msgspec.msgpack.encode(
            usage(self._state.records.values(), self._state.quotas, core.wall())
        )

    async def events(self, call: EventsSince) -> bytes:
        """Encoded ``list[Event]``: the newest ``limit`` events (of ``job``, else of
        every job and queue) numbered above ``after``, oldest first. Answers from memory
        even while the controller refuses to act."""
        history = self._state.history.since(call.after, call.job, call.limit)
        return msgspec.msgpack.encode(history)


def operator_may(operator: str, token: str, force: bool, refused: str) -> bool:
    """Whether an operator's change may go ahead, and forced (signed so in the history):
    ``token`` is the operator's (``operator``, its hash), or ``force`` is given.

    Raises:
        NotOwner: neither; the message starts with ``refused``.
    """
    if operator and owner_hash(token) == operator:
        return False
    if force:
        return True
    need = (
        "the operator's token (PLACECTL_OPERATOR_TOKEN)"
        if operator
        else "an operator token, and none is set (`placectl operator` sets "
        "PLACECTL_OPERATOR_TOKEN as this controller's)"
    )
    raise NotOwner(f"{refused}: it needs {need}, or --force")


class NodeCalls:
    """Answers ``cordon``, ``uncordon`` and ``cordons``. A cordon is written to the table
    before the node view leaves the node out; the loop moves a drained node's slots at
    its next tick, as for a node Ray drains. A fenced node is told dead to Ray after its
    cordon is written: from there it takes the road of a node that died (Ray's node
    event, the job's check, the repair), and its jobs are checked at once."""

    def __init__(self, ops: Operations) -> None:
        self._io, self._state, self._nodes = ops.ctx.io, ops.ctx.state, ops.ctx.nodes
        self._checker = ops.checker
        self._fencer = ops.fencer

    async def cordon(self, call: CordonNode) -> dict:
        """Take ``call.node`` out of placement (and drain or fence it); returns the
        cordon, the reservations moving off the node, and whether it was fenced.

        Raises:
            NotOwner: not the operator's token, and not ``force``.
            ReservationError: no alive node, or several, answer to the name; a fence of
                the head or of the controller's own node; a fence Ray refused (the
                cordon stays).
        """
        node = self._resolve(call.node, alive=True)
        how = "fencing" if call.fence else "draining" if call.drain else "cordoning"
        forced = operator_may(
            self._state.operator, call.token, call.force, f"{how} node {call.node!r} refused"
        )
        info = self._nodes.info(node)
        where = f"{info.ip} ({node[:12]})" if info else node[:12]
        if call.fence and (node == self._io.own_node() or (info and info.is_head)):
            raise ReservationError(
                f"node {where} runs this controller or Ray's head: fencing it would stop "
                "placectl or the cluster; drain it instead (placectl drain)"
            )
        why = call.why
        if call.fence:  # the listing says so: `placectl cordons`
            why = f"fenced: {why}" if why else "fenced"
        cordon = Cordon(
            node_id=node, ip=info.ip if info else "", drain=call.drain, why=why, at=core.wall()
        )
        with acting_as(client(owner_hash(call.token), forced)):
            await self._state.set_cordon(node, cordon, cordon.shown())
        self._refresh()
        moving = sorted(self._state.jobs_on(node)) if call.drain or call.fence else []
        if call.fence:
            await self._fence(cordon, where, call.why)
        return {**_shown(cordon), "moving": moving, "fence": call.fence}

    async def _fence(self, cordon: Cordon, where: str, why: str) -> None:
        """Tell Ray the cordon's node is dead (its raylet exits when it hears) the way
        the raylet watch fences (recorded, counted, posted to the node view), then check
        its jobs now: they are recorded degraded, and the loop is woken to repair them."""
        node, said = cordon.node_id, "the operator fenced it" + (f": {why}" if why else "")
        try:
            await self._fencer.fence_now(node, said)
        except Exception as e:
            raise ReservationError(
                f"node {where} is cordoned, but Ray refused its fence ({e}); fence it "
                "again, or stop the machine"
            ) from None
        await self._checker.confirm(self._state.jobs_on(node))

    async def uncordon(self, call: UncordonNode) -> dict:
        """Give ``call.node`` back to placement; returns the cordon lifted.

        Raises:
            NotOwner: not the operator's token, and not ``force``.
            ReservationError: no cordoned node answers to the name.
        """
        node = self._resolve(call.node, alive=False)
        forced = operator_may(
            self._state.operator, call.token, call.force, f"uncordoning node {call.node!r} refused"
        )
        cordon = self._state.cordons[node]
        with acting_as(client(owner_hash(call.token), forced)):
            await self._state.set_cordon(node, None, f"node {cordon.where()} uncordoned")
        self._refresh()
        return _shown(cordon)

    async def cordons(self) -> list[dict]:
        """Every node out of placement, oldest first."""
        return [_shown(c) for c in sorted(self._state.cordons.values(), key=lambda c: c.at)]

    def _refresh(self) -> None:
        self._nodes.cordons(self._state.cordons, Source.OPERATOR)

    def _resolve(self, name: str, alive: bool) -> str:
        if alive:
            alive = self._nodes.alive_ids()
            nodes = {n: (i.ip if (i := self._nodes.info(n)) else "") for n in alive}
        else:  # a cordoned node may be gone since
            nodes = {n: c.ip for n, c in self._state.cordons.items()}
        try:
            return resolve(name, nodes, "alive" if alive else "cordoned")
        except ValueError as e:
            if not alive and not nodes:
                raise ReservationError(f"node {name!r}: no node is cordoned") from None
            raise ReservationError(str(e)) from None


def _shown(c: Cordon) -> dict:
    return {"node": c.node_id, "ip": c.ip, "drain": c.drain, "why": c.why, "at": c.at}


__all__ = ["ChangeCalls", "NodeCalls", "QueueCalls", "operator_may"]
