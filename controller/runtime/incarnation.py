"""One run of the controller's process: its id, whether it is finished, and the crash
points tests arm to kill it at a chosen step."""

from __future__ import annotations

import logging
import os
import secrets

from controller.errors import ReservationError

log = logging.getLogger("placectl.controller")

FAULT_STEPS = frozenset(
    {
        "after_plan",
        "after_create",
        "after_ready",
        "after_probe",
        "after_write",
        "release_after_mark",
        "release_after_remove",
        "replace_after_plan",
        "replace_after_create",
        "replace_after_probe",
        "replace_after_write",
        "apply_after_intent",
        "apply_after_rebuild_removal",
        "apply_after_create",
        "apply_after_probe",
        "apply_after_write",
    }
)


class SimulatedCrash(BaseException):
    """A test fault in a controller that must not exit its process (the fake cluster's):
    it unwinds the call without running any rollback, as a real crash would."""


class Incarnation:
    """This run of the controller.

    Args:
        exit_process: a crash point ends the process (the real actor, which Ray then
            restarts); otherwise it raises :class:`SimulatedCrash` (unit tests).
    """

    def __init__(self, exit_process: bool) -> None:
        self.id = f"{os.getpid()}-{secrets.token_hex(4)}"  # new on every restart
        self.dead = False  # crashed at a test fault, or stopped: roll nothing back
        self._exit = exit_process
        self._armed: str | None = None

    def arm(self, step: str | None) -> None:
        """Test only: crash the next time ``step`` is reached (None disarms)."""
        if step is not None and step not in FAULT_STEPS:
            raise ReservationError(f"fault step {step!r}: one of {', '.join(sorted(FAULT_STEPS))}")
        self._armed = step

    def crash_point(self, step: str) -> None:
        """Die here if a test armed ``step``."""
        if self._armed != step:
            return
        log.warning("test fault injected at %s", step)
        if self._exit:
            os._exit(1)
        self.dead = True
        raise SimulatedCrash(step)
