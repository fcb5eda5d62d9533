"""The controller's calls about the queue: what waits and why, and each queue's quota.
Part of :class:`~controller.runtime.controller.PlacementController` (a mixin, so that the
facade stays one class Ray can host)."""

from __future__ import annotations

import msgspec

from controller.runtime.admission import Admitter
from controller.runtime.state import ReservationState
from controller.state.requests import check_queue, check_quota
from controller.state.status import QueueEntry


class QueueCalls:
    """``queue``, ``set_quota`` and ``quotas``; the facade provides ``_ready``."""

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

    async def set_quota(self, queue: str, limits: dict[str, float]) -> dict[str, float]:
        """Set ``queue``'s quota (resource -> the most its admitted reservations may hold
        together; ``{}`` removes it), written to the table before it applies. Reservations
        already admitted keep their resources; the next admissions respect it."""
        await self._ready()
        queue = check_queue(queue, allow_empty=False)
        limits = check_quota(limits)
        await self._state.set_quota(queue, limits)
        self._admitter.wake()
        return limits

    async def quotas(self) -> dict[str, dict[str, float]]:
        """Every queue's quota."""
        await self._ready()
        return {q: dict(v) for q, v in self._state.quotas.items()}


__all__ = ["QueueCalls"]
