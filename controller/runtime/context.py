"""What every operation of one controller shares, handed over as one object.

The operations (reserve, apply, repair, the queue, the checks, leases, the loop, the
raylet watch) each hold what they use of it; what one operation needs of another (the
checker, the leaser, the repairer) is passed beside it, by name.
"""

from __future__ import annotations

from controller.runtime.demand import Demand
from controller.runtime.incarnation import Incarnation
from controller.runtime.io import ClusterIO
from controller.runtime.node_view import ClusterNodes
from controller.runtime.progress import Progress
from controller.runtime.settings import Settings
from controller.runtime.state import ReservationState
from controller.runtime.stewards import Stewards
from controller.runtime.tasks import Tasks
from controller.runtime.transitions import Transitions


class Context:
    """One controller's shared parts.

    Attributes:
        io: the cluster (Ray, or the fake one).
        state: the state owner: what is known (read it; change it through ``records``).
        records: every change of a record, named (:mod:`controller.runtime.transitions`).
        nodes: the nodes as Ray last reported them.
        stewards: one per job, the only way its record changes: a step, one at a time.
        tasks: every task the controller runs beside its calls; ``stop()`` ends them.
        progress: what each job waits for, as its callers are told.
        demand: what the controller asks the cluster's autoscaler for, by owner.
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
        self.nodes = ClusterNodes()
        self.tasks = tasks or Tasks()
        self.stewards = Stewards(self.tasks)
        self.progress = Progress()
        name = prefix.removeprefix("placectl:").rstrip(":")
        self.demand = Demand(io, self.nodes, name, settings.demand_grace, settings.demand_free_wait)
