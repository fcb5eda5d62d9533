"""What every operation of one controller shares, handed over as one object, and the
two small parts only it makes: this run of the controller (its id, whether it is
finished, and the crash points tests arm to kill it at a chosen step) and what each
job's call in progress waits for.

The operations (reserve, apply, repair, the queue, the checks, leases, the loop, the
raylet watch) each hold what they use of it; what one operation needs of another (the
checker, the leaser, the repairer) is passed beside it, by name.
"""

from __future__ import annotations

import logging
import os
import secrets

from controller.errors import ReservationError
from controller.runtime.core import Tasks
from controller.runtime.core.claims import Claims
from controller.runtime.core.demand import Demand
from controller.runtime.core.flaps import Flaps
from controller.runtime.core.nodes import ClusterNodes
from controller.runtime.core.settings import Settings
from controller.runtime.core.state import ReservationState
from controller.runtime.core.stewards import Stewards
from controller.runtime.core.transitions import Transitions
from controller.runtime.edge import ClusterIO

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


class Progress:
    """The last thing each job's reserve, apply or repair said it waits for."""

    def __init__(self) -> None:
        self._messages: dict[str, str] = {}

    def say(self, job: str, message: str) -> None:
        self._messages[job] = message

    def clear(self, job: str) -> None:
        self._messages.pop(job, None)

    def of(self, job: str) -> str:
        return self._messages.get(job, "")


class Context:
    """One controller's shared parts.

    Attributes:
        io: the cluster (Ray, or the fake one).
        state: the state owner: what is known (read it; change it through ``records``).
        records: every change of a record, named (:mod:`controller.runtime.core.stewards`).
        nodes: the nodes as Ray last reported them.
        stewards: one per job, the only way its record changes: a step, one at a time.
        tasks: every task the controller runs beside its calls; ``stop()`` ends them.
        progress: what each job waits for, as its callers are told.
        demand: what the controller asks the cluster's autoscaler for, by owner.
        claims: the room on nodes that steps chose for groups they are making.
        incarnation: this run of the controller (tests' crash points).
        settings: timing and pacing.
        prefix: the name prefix of this controller's placement groups.
    """

    def __init__(
        self,
        io: ClusterIO,
        state: ReservationState,
        settings: Settings,
        prefix: str,
        incarnation: Incarnation,
        tasks: Tasks | None = None,
    ) -> None:
        self.io = io
        self.state = state
        self.records = Transitions(state)
        self.settings = settings
        self.prefix = prefix
        self.incarnation = incarnation
        flaps = Flaps(settings.hold_down_after, settings.hold_down_window, settings.hold_down)
        self.nodes = ClusterNodes(io, flaps)
        self.tasks = tasks or Tasks()
        self.stewards = Stewards(self.tasks)
        self.progress = Progress()
        self.claims = Claims()
        name = prefix.removeprefix("placectl:").rstrip(":")
        self.demand = Demand(io, self.nodes, name, settings.demand_grace, settings.demand_free_wait)
