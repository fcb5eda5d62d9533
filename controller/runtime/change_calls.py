"""The controller's calls that change a reservation: ``reserve``, ``cancel``,
``release``, ``release_all``, ``apply``, ``resize``, ``repair`` and port leases. A change
to a reservation another owns is refused unless forced (:mod:`controller.state.owners`),
and every change is signed in the history with its caller."""

from __future__ import annotations

import contextlib
import logging

import msgspec

from controller.errors import NotOwner
from controller.runtime.history import acting_as, client
from controller.runtime.operations import Operations
from controller.runtime.read_calls import status_bytes
from controller.state.lease_requests import LeaseCores, LeasePorts, ReleasePorts
from controller.state.owners import Caller, check_owner, owner_hash, owns
from controller.state.queueing import Terms
from controller.state.requests import (
    Apply,
    Everyone,
    JobOf,
    Owned,
    Reserve,
    Resize,
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
        )

    async def lease_cores(self, call: LeaseCores) -> dict[str, int | str]:
        """Lease CPU units of its node for ``component``'s ``rank`` (see
        :meth:`CoreLeaser.lease_cores`): the run and the node's total."""
        caller = self._owns(call.job, call.token, call.force, "a core lease")
        lease = await self._ops.core_leaser.lease_cores(
            call.job, call.component, call.rank, call.name, caller
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


__all__ = ["ChangeCalls"]
