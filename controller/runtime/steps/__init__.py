"""What the controller does, one operation per module, and here the operations of one
controller, made once and handed around as one object.

Each operation is built from the shared parts (a :class:`Context`) and the operations it
uses, in the order they use each other; the calls (:mod:`controller.runtime.changes`,
:mod:`controller.runtime.reads`) and the loop take this one object.
"""

from __future__ import annotations

from controller.runtime.core.context import Context
from controller.runtime.steps.applying import Applier
from controller.runtime.steps.checks import Checker
from controller.runtime.steps.fencing import Fencer
from controller.runtime.steps.holding import Holder
from controller.runtime.steps.leasing import CoreLeaser, Leaser
from controller.runtime.steps.liveness import Liveness
from controller.runtime.steps.reconcile import Reconciler
from controller.runtime.steps.repair import Repairer
from controller.runtime.steps.reserving import Reserver


class Operations:
    """What one controller does, one object per kind.

    Attributes:
        checker: what Ray says about each reservation, ready or degraded.
        leaser: master ports and leased ports.
        core_leaser: the CPU units engine ranks bind.
        repairer: replacing a lost node's slots (the one place to open to change repair).
        holder: the spare nodes a reservation holds for its repairs (``cluster.spares``).
        reserver: reserve, cancel, release; it owns the ``admitter`` (the queue).
        applier: apply and resize.
        reconciler: recovery on start, and the loop's ticks.
        fencer: tells Ray a node is dead (the watch's proof or grace, an operator).
        liveness: the raylets of reserved nodes asked whether they answer; a node that
            does not is suspected (its slots move) and fenced only on proof or after its
            grace; what it finds goes to the node view's inbox.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.checker = Checker(ctx)
        self.leaser = Leaser(ctx)
        self.core_leaser = CoreLeaser(ctx)
        self.repairer = Repairer(ctx, self.checker, self.leaser)
        self.reserver = Reserver(ctx, self.checker, self.leaser, self.repairer)
        self.admitter = self.reserver.admitter
        self.applier = Applier(ctx, self.checker, self.leaser)
        self.holder = Holder(ctx)
        self.reconciler = Reconciler(ctx, self.checker, self.reserver, self.repairer, self.holder)
        self.fencer = Fencer(ctx)
        self.liveness = Liveness(ctx, self.fencer)
