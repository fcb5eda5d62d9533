"""What ``status`` and ``list`` answer about reservations."""

from __future__ import annotations

import msgspec

from controller.planning.node_groups import ACCELERATOR
from controller.state.records import ReservationRecord, SlotRecord


class SlotInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One node slot of a reservation."""

    node_rank: int
    node_id: str
    node_ip: str
    group_id: str
    accelerators: list[int]  # physical ids, in planned local order
    local_to_physical: dict[int, int]  # planned node-local index -> physical id
    bundles: int
    topology: str = ""  # the node's NVLink domain, rack, topology rank ("" when unknown)


class ReservationInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A reservation as clients see it."""

    job: str
    state: str
    epoch: int
    reason: str
    created_at: float
    components: dict[str, int]  # name -> world size
    accelerator: str
    slots: list[SlotInfo]
    uid: str = ""
    repair: str = "auto"
    queue: str = ""
    priority: int = 0
    queued_at: float = 0.0
    preemptible: bool = False
    preempt_at: float = 0.0  # released at this wall-clock time (0: not being preempted)
    # Draining nodes its slots moved off: node id -> when the old group there is removed
    # (wall-clock); workers still running there should move before (WorkerGroup.sync()).
    leaving: dict[str, float] = {}
    # Spare nodes held for its repairs (cluster.spares): the groups held now, and how
    # many it asks for. A repair makes a held one a slot, and another is taken after.
    spares: list[SlotInfo] = []
    spares_wanted: int = 0

    @property
    def preempting(self) -> bool:
        """Being taken back for a reservation of higher priority (until ``preempt_at``);
        its state stays what it is, and its processes keep running until then."""
        return self.preempt_at > 0

    @property
    def num_accelerators(self) -> int:
        return sum(len(s.accelerators) for s in self.slots)


def _topology(res: ReservationRecord, node_rank: int) -> str:
    node = res.nodes.get(node_rank)
    return node.topology.describe() if node is not None and node.topology.known else ""


def summarize(res: ReservationRecord) -> ReservationInfo:
    """What ``status`` shows of a record."""
    return ReservationInfo(
        job=res.job,
        state=res.state,
        epoch=res.epoch,
        reason=res.reason,
        created_at=res.created_at,
        components=dict(res.world_sizes),
        accelerator=res.spec.accelerator,
        uid=res.uid,
        repair=res.repair,
        queue=res.queue,
        priority=res.priority,
        queued_at=res.queued_at,
        preemptible=res.preemptible,
        preempt_at=res.preempt_at,
        leaving={x.node_id: x.remove_at for x in res.leaving},
        slots=[_slot(res, s) for s in res.slots],
        spares=[_slot(res, s) for s in res.spares],
        spares_wanted=res.spec.spares,
    )


def _slot(res: ReservationRecord, s: SlotRecord) -> SlotInfo:
    return SlotInfo(
        node_rank=s.node_rank,
        node_id=s.node_id,
        node_ip=s.node_ip,
        group_id=s.group_id,
        accelerators=[b.physical_id for b in s.bundles if b.kind == ACCELERATOR],
        local_to_physical={
            b.local_index: b.physical_id for b in s.bundles if b.kind == ACCELERATOR
        },
        bundles=len(s.bundles),
        topology=_topology(res, s.node_rank),
    )


class QueueEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One queued reservation as ``placectl queue`` shows it.

    Attributes:
        position: 1 for the next to be admitted.
        job, queue, priority, queued_at: from its record (``queued_at``: wall clock).
        wants: what it asks for in total, per resource (once planned).
        why: why it waits, as of the last decision (what is missing, and whose).
    """

    position: int
    job: str
    queue: str
    priority: int
    queued_at: float
    wants: dict[str, float] = {}
    why: str = ""
