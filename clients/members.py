"""What the controller says of a group's members: which ranks, each known by the node
its process was started on, are lost, and why. A member is lost when the controller's
verdict on its node ends it (suspected, moved off, dead: :data:`ENDING`), or when the
reservation now puts its rank on another node (a standby promoted, a relaunch
elsewhere). Read by a :class:`clients.collective.GuardedGroup` inside a rank, and by a
driver waiting on a group's calls (:mod:`clients.gathering`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# A look at the controller's verdicts waits this long for one to change.
LOOK_WAIT_S = 1.0
# Verdicts on a member's node that end it (controller.state.verdicts).
ENDING = {"suspected": "suspected", "moved": "moved off", "dead": "dead"}


def lost_members(
    members: Sequence[str],
    own: int,
    verdicts: Mapping[str, str],
    now: Sequence[str] | None,
) -> dict[int, str]:
    """The ranks of a generation formed on ``members`` (each rank's node id) that are
    lost, and why, to rank ``own``: a node verdict that ends it (:data:`ENDING`), or the
    rank's slot now on another node (``now``: each rank's node in the reservation; None
    when the reservation is gone or another took its name: every other rank is lost)."""
    out: dict[int, str] = {}
    for r, node in enumerate(members):
        if r == own:
            continue
        if now is None:
            out[r] = "the reservation was released or replaced"
        elif (v := verdicts.get(node)) in ENDING:
            out[r] = f"its node {node[:12]} is {ENDING[v]}"
        elif r < len(now) and now[r] != node:
            out[r] = f"its slot moved from node {node[:12]} to {now[r][:12]}"
    return out


class ControllerLook:
    """What a rank asks of the controller about its group's members: the verdicts on
    their nodes (waiting for one to change after the first look) and where the
    reservation puts each rank now (one read of its record)."""

    def __init__(
        self, controller: Any, job: str, component: str, uid: str, wait_s: float = LOOK_WAIT_S
    ) -> None:
        self._ctl, self._job, self._component, self._uid = controller, job, component, uid
        self._held: dict[str, str] | None = None
        self._wait = wait_s  # how long a look after the first waits for a change

    def __call__(self, members: Sequence[str], own: int) -> dict[int, str]:
        from clients.reservation import Reservation

        wait = self._wait if self._held is not None else 0.0
        self._held = self._ctl.verdicts(self._job, list(set(members)), self._held, wait)
        record = self._ctl.record(self._job)
        now = None
        if record.uid == self._uid and self._component in record.world_sizes:
            items = Reservation(self._ctl, record).assignments(self._component, allow_degraded=True)
            now = [a.placement.node_id for a in items]
        return lost_members(members, own, self._held, now)


__all__ = ["ENDING", "LOOK_WAIT_S", "ControllerLook", "lost_members"]
