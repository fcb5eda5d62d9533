"""The controller's calls that read reservations: ``status``, ``list``, ``suspects``,
``verdicts``, ``assignments``, ``component``, ``standbys``. What they answer is
confirmed against Ray first: never ``ready`` while Ray reports a node of the reservation
dead."""

from __future__ import annotations

import msgspec

from controller.errors import PlacementError, ReservationError
from controller.runtime.checks import Checker
from controller.runtime.liveness import SILENT_NODE
from controller.runtime.operations import Operations
from controller.state.records import ReservationRecord
from controller.state.requests import ComponentOf, JobOf, NodesOf
from controller.state.spares import standby_assignments
from controller.state.status import summarize


def status_bytes(checker: Checker, res: ReservationRecord) -> bytes:
    """The encoded :class:`ReservationInfo` of ``res`` as Ray last reported its nodes."""
    return msgspec.msgpack.encode(summarize(checker.truthful(res)))


class ReadCalls:
    """Answers the calls that read reservations, each given its checked request."""

    def __init__(self, ops: Operations) -> None:
        self._ops = ops
        self._state = ops.ctx.state

    async def _settled(self, job: str) -> ReservationRecord:
        await self._ops.checker.confirm([job])
        res = self._state.require(job)
        if not res.settled:
            raise ReservationError(f"reservation {job!r} is {res.state}; assignments need ready")
        return res

    async def assignments(self, call: ComponentOf) -> bytes:
        """The msgpack-encoded ``list[Assignment]`` of one component, in rank order."""
        await self._settled(call.job)
        encoded = await self._state.encoded(call.job)
        if call.component not in encoded:
            raise PlacementError(
                f"unknown component {call.component!r} in {call.job!r}; it has {', '.join(encoded)}"
            )
        return encoded[call.component]

    async def component(self, call: ComponentOf) -> bytes:
        """The msgpack-encoded :class:`ComponentBlock` of ``job``'s current epoch."""
        await self._settled(call.job)
        published = await self._state.published(call.job)
        if call.component not in published.components:
            raise PlacementError(f"unknown component {call.component!r} in {call.job!r}")
        return msgspec.msgpack.encode(published.components[call.component])

    async def standbys(self, call: ComponentOf) -> bytes:
        """The msgpack-encoded ``list[Assignment]`` the standby processes of one
        component start with on ``job``'s held spares (empty when it holds none)."""
        res = await self._settled(call.job)
        if call.component not in res.world_sizes:
            raise PlacementError(
                f"unknown component {call.component!r} in {call.job!r}; it has "
                f"{', '.join(res.world_sizes)}"
            )
        plan = (await self._state.plan(call.job)).plan
        return msgspec.msgpack.encode(standby_assignments(res, plan, call.component))

    async def status(self, call: JobOf) -> bytes:
        """The encoded :class:`ReservationInfo` of ``job``: never ``ready`` while Ray
        reports one of its nodes dead, nor while one of its raylets refuses connections
        (the node is fenced first, see :mod:`controller.runtime.liveness`)."""
        await self._suspect(call.job)
        await self._ops.checker.confirm([call.job])
        return status_bytes(self._ops.checker, self._state.require(call.job))

    async def _suspect(self, job: str) -> dict[str, str]:
        """Ask the raylets of ``job``'s nodes now; the verdict on each of them."""
        res = self._state.get(job)
        if res is None or not res.settled:
            return {}
        return await self._ops.liveness.check_now(res.node_ids())

    async def suspects(self, call: JobOf) -> list[str]:
        """The nodes of ``job`` whose raylets do not answer now and that are not fenced
        yet (each is fenced once silent for ``settings.fence_after`` and confirmed by
        witnesses); a refusing one is fenced by this call."""
        verdicts = await self._suspect(call.job)
        await self._ops.checker.confirm([call.job])
        return sorted(n for n, v in verdicts.items() if v == SILENT_NODE)

    async def verdicts(self, call: NodesOf) -> dict[str, str]:
        """The controller's verdict on each node of ``job`` and each of ``nodes`` (the
        nodes a driver's ranks ran on), after asking the job's raylets now: ``alive``,
        ``silent`` (no verdict yet), ``dead`` (Ray reports it dead, or it was fenced) or
        ``unknown`` (placectl's calls are refused there, or the controller suspects
        itself: Ray's verdict decides). What a driver's ``repair()`` waits on."""
        await self._suspect(call.job)
        await self._ops.checker.confirm([call.job])
        res = self._state.get(call.job)
        nodes = set(call.nodes) | (res.node_ids() if res is not None else set())
        return dict(sorted(self._ops.liveness.verdicts(nodes).items()))

    async def list(self) -> bytes:
        """Encoded ``list[ReservationInfo]`` of every reservation, by job name."""
        records = self._state.records
        await self._ops.checker.confirm(list(records))
        checker = self._ops.checker
        return msgspec.msgpack.encode(
            [summarize(checker.truthful(records[j])) for j in sorted(records)]
        )


__all__ = ["ReadCalls", "status_bytes"]
