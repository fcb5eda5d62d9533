"""The controller's calls that report on it rather than change anything: what a call in
progress waits for, liveness, health, and the hooks tests and benchmarks use. They answer
even while the controller refuses to act."""

from __future__ import annotations

from typing import Any

from controller.errors import ReservationError
from controller.runtime.channels import TEST_HOOKS
from controller.runtime.operations import Operations
from controller.runtime.readiness import Readiness
from controller.runtime.settings import changed
from controller.state.requests import Fault, JobOf
from controller.version import version


class DiagnosticCalls:
    """Answers ``progress``, ``check_alive``, ``health``, ``arm_fault``, ``timings`` and
    ``group_prefix``."""

    def __init__(self, ops: Operations, readiness: Readiness) -> None:
        self._ops = ops
        self._ctx = ops.ctx
        self._readiness = readiness

    async def progress(self, call: JobOf) -> str:
        """What a reservation in progress is waiting for ("" when nothing)."""
        return self._ctx.progress.of(call.job)

    async def check_alive(self) -> str:
        """Answers this incarnation's id, which changes on every restart."""
        return self._ctx.incarnation.id

    async def health(self) -> dict[str, Any]:
        """Version, incarnation, node, recovery, refusal, how node events arrive, GCS
        store, fenced nodes, who refuses placectl's own calls (``denied``: node id or
        ``gcs`` -> why), the fences that failed, whether the controller suspects itself
        (``cut_off``: it reaches no majority of the nodes it asks), the nodes an
        operator cordoned (``cordoned``: node id -> what and why), the steps the
        reservations' stewards run and hold (``steps``: job -> the trigger of the step
        running, then of those waiting), and the settings that differ from the defaults."""
        io = self._ctx.io
        return {
            "version": version(),
            "incarnation": self._ctx.incarnation.id,
            "node_id": io.own_node(),
            "recovered": self._readiness.recovered.is_set(),
            "refusal": self._readiness.refusal,
            "reservations": len(self._ctx.state.records),
            "node_events": io.watching(),
            "gcs_store": io.gcs_store(),
            "fenced": dict(self._ops.liveness.fenced),
            "denied": dict(self._ops.liveness.denied),
            "fence_failures": self._ops.liveness.fence_failures,
            "cut_off": self._ops.liveness.cut_off,
            "cordoned": {n: c.shown() for n, c in self._ctx.state.cordons.items()},
            "steps": self._ctx.stewards.doing(),
            "settings": changed(self._ctx.settings),
        }

    # ------------------------------------------------------------ testing
    async def arm_fault(self, call: Fault) -> None:
        """Test only: crash the next time ``step`` is reached. Refused unless the
        controller was started with its test hooks (``Settings.test_hooks``)."""
        if not self._ctx.settings.test_hooks:
            raise ReservationError(
                f"arm_fault({call.step!r}) is a test hook: this controller was not started "
                f"for tests ({TEST_HOOKS}=1 in its environment, as placectl's test clusters "
                "set it); nothing was armed"
            )
        self._ctx.incarnation.arm(call.step)

    async def timings(self) -> dict[str, float]:
        """How long the last new reservation took to plan, place and probe."""
        return dict(self._ops.reserver.last_timings)

    async def group_prefix(self) -> str:
        """The name prefix of this controller's placement groups."""
        return self._ctx.prefix


__all__ = ["DiagnosticCalls"]
