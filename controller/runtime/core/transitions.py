"""Transitions: every change of a reservation's record, named, in one place.

The stewards decide *when* a record changes (in a step of the job's steward); the
:class:`Transitions` say *what* each change is: it builds the
new record from the one the operation read (the ``base``) and commits it through the
state owner, which refuses it if ``base`` is no longer the job's record
(:class:`~controller.errors.StaleChange`) and writes it to the table before memory. No
other module calls :meth:`ReservationState.commit` or :meth:`ReservationState.forget`
(``tests/unit/test_layers.py`` checks it), so the list below is every way a record
changes.
"""

from __future__ import annotations

import msgspec

from controller.runtime.core.state import ReservationState
from controller.state.leases import CoreLease, PortLease
from controller.state.published import Published
from controller.state.records import DEGRADED, READY, RELEASING, Applying, ReservationRecord
from controller.state.standbys import settle_standby_leases
from controller.state.table import StoredPlan

_replace = msgspec.structs.replace


class Transitions:
    """The changes of a record, each committed on the record it was built from."""

    def __init__(self, state: ReservationState) -> None:
        self._state = state

    # ------------------------------------------------------------ created and removed
    async def created(
        self,
        record: ReservationRecord,
        base: ReservationRecord | None,
        plan: StoredPlan | None = None,
    ) -> ReservationRecord:
        """A new record of the job (pending, or queued), replacing ``base`` if any."""
        await self._state.commit(record, base=base, plan=plan)
        return record

    async def forgotten(self, job: str) -> None:
        """The job's record and what hangs off it are gone (its groups already are)."""
        await self._state.forget(job)

    # ------------------------------------------------------------ placed and moved
    async def placed(
        self,
        record: ReservationRecord,
        base: ReservationRecord,
        published: Published,
        plan: StoredPlan | None = None,
    ) -> ReservationRecord:
        """``record`` (placed, repaired, moved or applied) with its assignments
        published, replacing ``base``."""
        record = _settled(record)
        await self._state.commit(record, base=base, plan=plan, published=published)
        return record

    async def ready(self, base: ReservationRecord, reason: str = "") -> ReservationRecord:
        """Every slot is where Ray says it is."""
        return await self._commit(_replace(base, state=READY, reason=reason), base)

    async def judged(
        self, base: ReservationRecord, state: str, reason: str, cause: str = ""
    ) -> ReservationRecord:
        """A check's verdict: ready, or degraded, why (for people) and its cause (one of
        :data:`controller.state.causes.CAUSES`)."""
        return await self._commit(_replace(base, state=state, reason=reason, cause=cause), base)

    async def explained(self, base: ReservationRecord, reason: str) -> ReservationRecord:
        """Why it stays as it is (a repair that found no room, a queue entry put back, a
        release waiting for Ray)."""
        return await self._commit(_replace(base, reason=reason), base)

    async def releasing(self, base: ReservationRecord, reason: str) -> ReservationRecord:
        """Its groups are being removed; the record goes once Ray reports them gone."""
        return await self._commit(_replace(base, state=RELEASING, reason=reason), base)

    async def left_behind(self, base: ReservationRecord, leaving: list) -> ReservationRecord:
        """The old groups of a drained node's slots still kept until their deadline."""
        return await self._commit(_replace(base, leaving=leaving), base)

    async def held(
        self, base: ReservationRecord, spares: list, short: str = ""
    ) -> ReservationRecord:
        """The groups it holds on spare nodes, some taken or dropped (the leases of a
        dropped one's standbys end with it), and why it holds fewer than it asks."""
        record = _replace(base, spares=spares, spares_short=short)
        record = settle_standby_leases(record, None)
        return await self._commit(record, base)

    # ------------------------------------------------------------ terms
    async def policy(self, base: ReservationRecord, repair: str) -> ReservationRecord:
        """Its repair policy, as the same reserve asked it again."""
        return await self._commit(_replace(base, repair=repair), base)

    async def terms(self, base: ReservationRecord, asked: dict) -> ReservationRecord:
        """A queued reservation's terms (priority, preemptible, grace), asked again."""
        return await self._commit(_replace(base, **asked), base)

    async def preempted(self, base: ReservationRecord, at: float, reason: str) -> ReservationRecord:
        """Chosen to be taken back: released at ``at`` (wall clock)."""
        return await self._commit(_replace(base, preempt_at=at, reason=reason), base)

    async def leases(self, base: ReservationRecord, leases: list[PortLease]) -> ReservationRecord:
        """Its port leases, one added or some ended."""
        return await self._commit(_replace(base, leases=leases), base)

    async def cores(self, base: ReservationRecord, cores: list[CoreLease]) -> ReservationRecord:
        """Its core leases, one added."""
        return await self._commit(_replace(base, cores=cores), base)

    # ------------------------------------------------------------ apply
    async def applying(self, base: ReservationRecord, intent: Applying | None) -> ReservationRecord:
        """An apply's intent written ahead (or, None, cleared: rolled back or ended)."""
        return await self._commit(_replace(base, applying=intent), base)

    async def _commit(
        self, record: ReservationRecord, base: ReservationRecord
    ) -> ReservationRecord:
        record = _settled(record)
        await self._state.commit(record, base=base)
        return record


def _settled(record: ReservationRecord) -> ReservationRecord:
    """A record carries a cause only while it is degraded."""
    if record.cause and record.state != DEGRADED:
        return _replace(record, cause="")
    return record


__all__ = ["Transitions"]
