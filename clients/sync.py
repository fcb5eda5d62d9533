"""What a running worker group must do to reach its reservation's current epoch.

Compared rank by rank, the assignments a group's workers were started with and the
current ones decide: a rank whose process can keep running (same node, same group and
bundles, same devices, a share no smaller) is kept; one that runs elsewhere is moved
(stopped, then started anew); ranks past the old world size start, ranks past the new
one stop. A component whose world size changed, or whose rank 0 or master address
moved, needs a new process group: the result says so.
"""

from __future__ import annotations

import msgspec

from controller.state.assignments import Assignment


class SyncResult(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`WorkerGroup.sync` did (or, with nothing to do, found).

    Attributes:
        kept: ranks left running.
        moved: ranks stopped and started again in their new place.
        started, stopped: ranks that are new, or gone.
        restart_needed: why the component needs a new process group ("" if it does
            not): its world size changed, or its rank 0 or master moved. The kept ranks
            still hold the old one; ``sync(restart=True)`` restarts every rank instead.
        restarted: every rank was restarted.
    """

    component: str
    epoch: int
    kept: list[int] = []
    moved: list[int] = []
    started: list[int] = []
    stopped: list[int] = []
    restart_needed: str = ""
    restarted: bool = False


def can_keep(old: Assignment, new: Assignment) -> bool:
    """Whether a worker started with ``old`` can keep running under ``new``."""
    a, b = old.placement, new.placement
    return (
        a.node_id == b.node_id
        and old.placement_group_id == new.placement_group_id
        and old.bundle_index == new.bundle_index
        and old.bundle_indices == new.bundle_indices
        and a.cuda_visible_devices == b.cuda_visible_devices
        and old.resources.keys() == new.resources.keys()
        and new.num_gpus >= old.num_gpus
        and new.child_share >= old.child_share
    )


def plan_sync(
    component: str, epoch: int, old: list[Assignment], new: list[Assignment]
) -> SyncResult:
    """The ranks to keep, move, start and stop, and whether a new process group is
    needed (see the module docstring)."""
    kept, moved = [], []
    for r in range(min(len(old), len(new))):
        (kept if can_keep(old[r], new[r]) else moved).append(r)
    why = ""
    if old and new:
        if len(old) != len(new):
            why = f"world size {len(old)} -> {len(new)}"
        elif 0 in moved:
            why = "rank 0 moved"
        else:
            master = ("MASTER_ADDR", "MASTER_PORT")
            if any(old[0].env.get(k) != new[0].env.get(k) for k in master):
                why = "the master address or port changed"
    return SyncResult(
        component=component,
        epoch=epoch,
        kept=kept,
        moved=moved,
        started=list(range(len(old), len(new))),
        stopped=list(range(len(new), len(old))),
        restart_needed=why,
    )
