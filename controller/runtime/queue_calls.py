"""The controller's calls about queues: what waits and why, each queue's quota and use,
who may change quotas, and the event history.
Part of :class:`~controller.runtime.controller.PlacementController` (a mixin, so that the
facade stays one class Ray can host)."""

from __future__ import annotations

import time

import msgspec

from controller.errors import NotOwner, ReservationError
from controller.runtime.admission import Admitter
from controller.runtime.history import acting_as, client
from controller.runtime.state import ReservationState
from controller.state.owners import owner_hash
from controller.state.requests import check_flag, check_job, check_queue, check_quota, check_token
from controller.state.status import QueueEntry
from controller.state.usage import usage


class QueueCalls:
    """``queue``, ``set_quota``, ``set_operator``, ``quotas``, ``queues``, ``events``; the
    facade provides ``_ready``."""

    _admitter: Admitter
    _state: ReservationState

    async def _ready(self) -> None:  # pragma: no cover - the facade's
        raise NotImplementedError

    async def queue(self) -> bytes:
        """Encoded ``list[QueueEntry]``: every queued reservation in admission order,
        with what it asks for and why it waits, as of the last decision."""
        await self._ready()
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

    async def set_quota(
        self, queue: str, limits: dict[str, float], token: str = "", force: bool = False
    ) -> dict[str, float]:
        """Set ``queue``'s quota (resource -> the most its admitted reservations may hold
        together; ``{}`` removes it), written to the table before it applies. Reservations
        already admitted keep their resources; the next admissions respect it.

        Args:
            token: the operator's token (see :meth:`set_operator`).
            force: change it without the operator's token (signed so in the history).

        Raises:
            NotOwner: ``token`` is not the operator's and ``force`` is not given.
        """
        await self._ready()
        queue = check_queue(queue, allow_empty=False)
        limits = check_quota(limits)
        forced = self._operator_may(check_token(token), check_flag(force, "force"), queue)
        with acting_as(client(owner_hash(token), forced)):
            await self._state.set_quota(queue, limits)
        self._admitter.wake()
        return limits

    def _operator_may(self, token: str, force: bool, queue: str) -> bool:
        operator = self._state.operator
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
        raise NotOwner(f"changing the quota of {queue!r} refused: it needs {need}, or --force")

    async def set_operator(self, token: str, force: bool = False) -> str:
        """Make ``token`` the operator's: quota changes then need it (or ``force``).
        Returns the first characters of its hash, as the history shows it.

        Raises:
            NotOwner: another operator token is set and ``force`` is not given.
        """
        await self._ready()
        token, force = check_token(token), check_flag(force, "force")
        if not token:
            raise ReservationError("operator token: expected a non-empty string")
        hashed = owner_hash(token)
        current = self._state.operator
        if current and current != hashed and not force:
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
        await self._ready()
        return {q: dict(v) for q, v in self._state.quotas.items()}

    async def queues(self) -> bytes:
        """Encoded ``list[QueueUsage]``: every queue's quota beside what its placed
        reservations hold and how many wait (``""``: reservations made without a queue,
        which no quota limits)."""
        await self._ready()
        return msgspec.msgpack.encode(
            usage(self._state.records.values(), self._state.quotas, time.time())
        )

    async def events(self, job: str | None = None, after: int = 0, limit: int = 100) -> bytes:
        """Encoded ``list[Event]``: the newest ``limit`` events (of ``job``, else of
        every job and queue) numbered above ``after``, oldest first. Answers from memory
        even while the controller refuses to act."""
        if job is not None:
            check_job(job)
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ReservationError(f"after {after!r}: expected an event number >= 0")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= 10_000:
            raise ReservationError(f"limit {limit!r}: expected an int in [1, 10000]")
        return msgspec.msgpack.encode(self._state.history.since(after, job, limit))


__all__ = ["QueueCalls"]
