"""The controller's calls about queues: what waits and why, each queue's quota and use,
who may change quotas, and the event history."""

from __future__ import annotations

import msgspec

from controller.errors import NotOwner
from controller.runtime import tasks
from controller.runtime.history import acting_as, client
from controller.runtime.operations import Operations
from controller.state.owners import owner_hash
from controller.state.queueing import usage
from controller.state.requests import EventsSince, SetOperator, SetQuota
from controller.state.status import QueueEntry


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
            usage(self._state.records.values(), self._state.quotas, tasks.wall())
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


__all__ = ["QueueCalls", "operator_may"]
