"""Standby processes on held spares: what each starts with (the ranks of the node its
spare copies, less the job-wide identity), and whose its leases are once a repair has
made the spare a slot."""

from __future__ import annotations

import msgspec

from controller.state.assignments import Assignment, build_assignments
from controller.state.plan import JobPlan
from controller.state.records import ReservationRecord
from controller.state.spares import copied_rank

# Job-wide identity a standby process must not have: it is no rank until promoted, and a
# collective formed from its environment (torch's env://) must fail, not join as another.
_NO_RANK_YET = ("RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
STANDBY = "PLACECTL_STANDBY"


def standby_assignments(res: ReservationRecord, plan: JobPlan, component: str) -> list[Assignment]:
    """What the standby processes of ``component`` start with, spare by spare: the
    ranks the copied node holds, as they would be were that
    node's slots the held spare's group (its devices and node-local environment), less
    the job-wide identity (``RANK``, ``MASTER_ADDR``, ...), with ``PLACECTL_STANDBY=1``.

    A repair that makes the spare a lost node's slot keeps the group and its bundle
    indices, so a standby stands in for the lost rank whose new assignment names its
    ``(placement_group_id, bundle_index)``. Each spare runs the standbys of the node it
    copies (:func:`copied_rank`): none of ``component`` where that node has no rank of it."""
    out = []
    for spare in res.spares:
        rank = copied_rank(res, spare)
        others = [s for s in res.slots if s.node_rank != rank]
        stand_in = msgspec.structs.replace(
            res, slots=[*others, msgspec.structs.replace(spare, node_rank=rank)]
        )
        for a in build_assignments(stand_in, plan).get(component, []):
            if a.placement.node_rank != rank:
                continue
            env = {k: v for k, v in a.env.items() if k not in _NO_RANK_YET}
            out.append(msgspec.structs.replace(a, env={**env, STANDBY: "1"}))
    return out


def standby_at(
    res: ReservationRecord, plan: JobPlan, component: str, standby: tuple[str, int]
) -> Assignment | None:
    """The assignment of ``component``'s standby in the held spare's bundle ``standby``
    (placement group id, bundle index), or None when there is none."""
    for a in standby_assignments(res, plan, component):
        if (a.placement_group_id, a.bundle_index) == tuple(standby):
            return a
    return None


def settle_standby_leases(res: ReservationRecord, plan: JobPlan | None) -> ReservationRecord:
    """``res`` with the leases of its standbys (``standby`` set) settled: each stays while
    its spare is held; once a repair has made the spare a slot (``plan`` given), it
    becomes the lease of the rank of its component now in its bundle (the standby,
    promoted: the ports it listens on and the cores it binds stay its own), or ends
    when another component's rank is there; it ends with a spare that is let go."""
    held = {s.group_id for s in res.spares}
    ranks: dict[tuple[str, str, int], int] = {}
    if plan is not None:
        for component, items in build_assignments(res, plan).items():
            for a in items:
                ranks[(component, a.placement_group_id, a.bundle_index)] = a.placement.rank

    def settled(items: list) -> list:
        out = []
        for x in items:
            if x.standby is None or x.standby[0] in held:
                out.append(x)
            elif (rank := ranks.get((x.component, *x.standby))) is not None:
                out.append(msgspec.structs.replace(x, rank=rank, standby=None))
        return out

    leases, cores = settled(res.leases), settled(res.cores)
    if leases == res.leases and cores == res.cores:
        return res
    return msgspec.structs.replace(res, leases=leases, cores=cores)
