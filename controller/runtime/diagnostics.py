"""The controller's calls that report on it rather than change anything: what a call in
progress waits for, liveness, health, and the hooks tests and benchmarks use. Part of
:class:`~controller.runtime.controller.PlacementController` (a mixin, so that the facade
stays one class Ray can host); they answer even while the controller refuses to act."""

from __future__ import annotations

import asyncio
from typing import Any

from controller.runtime.incarnation import Incarnation
from controller.runtime.io import ClusterIO
from controller.runtime.liveness import Liveness
from controller.runtime.progress import Progress
from controller.runtime.reserving import Reserver
from controller.runtime.state import ReservationState
from controller.version import version


class DiagnosticCalls:
    """``progress``, ``check_alive``, ``health``, ``arm_fault``, ``timings``,
    ``group_prefix``; the facade provides the attributes."""

    _progress: Progress
    _incarnation: Incarnation
    _io: ClusterIO
    _recovered: asyncio.Event
    _refusal: str | None
    _state: ReservationState
    _reserver: Reserver
    _prefix: str
    _liveness: Liveness

    async def progress(self, job: str) -> str:
        """What a reservation in progress is waiting for ("" when nothing)."""
        return self._progress.of(job)

    async def check_alive(self) -> str:
        """Answers this incarnation's id, which changes on every restart; answers even
        while the controller refuses to act."""
        return self._incarnation.id

    async def health(self) -> dict[str, Any]:
        """Version, incarnation, node, recovery, refusal, how node events arrive, GCS
        store, fenced nodes."""
        return {
            "version": version(),
            "incarnation": self._incarnation.id,
            "node_id": self._io.own_node(),
            "recovered": self._recovered.is_set(),
            "refusal": self._refusal,
            "reservations": len(self._state.records),
            "node_events": self._io.watching(),
            "gcs_store": self._io.gcs_store(),
            "fenced": dict(self._liveness.fenced),
        }

    # ------------------------------------------------------------ testing
    async def arm_fault(self, step: str | None) -> None:
        """Test only: crash the next time ``step`` is reached."""
        self._incarnation.arm(step)

    async def timings(self) -> dict[str, float]:
        """How long the last new reservation took to plan, place and probe."""
        return dict(self._reserver.last_timings)

    async def group_prefix(self) -> str:
        return self._prefix


__all__ = ["DiagnosticCalls"]
