"""What drivers read: assignments as they are stored for them (one GCS key per component
and epoch), and what ``status`` and ``list`` answer.

A rank's full environment is its component's common variables plus its own; storing
them apart keeps a 1,000-rank component's key near half the size, and a driver decodes
only the component it asks for.

**Status**: what ``status`` and ``list`` answer about reservations.
"""

from __future__ import annotations

import msgspec

from controller.planning.node_groups import ACCELERATOR
from controller.planning.placement import Placement
from controller.state.assignments import Assignment, build_assignments
from controller.state.plan import JobPlan
from controller.state.records import SCHEMA_VERSION, UNTIL_BACK, ReservationRecord, SlotRecord
from controller.state.spares import copied_rank


class Row(msgspec.Struct, frozen=True, array_like=True):
    """One rank as stored: what differs between the ranks of a component."""

    placement: Placement
    slot: int  # index into ComponentBlock.groups
    bundle_index: int
    num_gpus: float
    num_cpus: float
    env: dict[str, str]  # what differs from the component's common env
    resources: dict[str, float] = {}
    python: str | None = None
    bundle_indices: list[int] = []
    child_share: float = 0.0
    device_uuids: list[str] = []
    pci_bus_ids: list[str] = []
    ray_sets_devices: bool = False
    epoch: int = 0  # the epoch this rank's assignment was made in (0: the block's)


class ComponentBlock(msgspec.Struct, frozen=True, kw_only=True):
    """One component's assignments of one reservation epoch, as stored for drivers
    (one GCS key each): what every rank shares once, then a row per rank."""

    v: int = SCHEMA_VERSION
    job: str
    uid: str
    epoch: int
    component: str
    capture_child_tasks: bool
    accelerator: str
    groups: list[str]  # placement group id of each slot the rows refer to
    env: dict[str, str]  # common to every rank
    rows: list[Row]

    def assignments(self) -> list[Assignment]:
        """Every rank's :class:`Assignment`, in rank order."""
        common, groups = self.env, self.groups
        # Field by field, here and in _block: a generic copy takes twice as long on this,
        # a driver's hot path (tests round-trip every field).
        return [
            Assignment(
                placement=r.placement,
                bundle_index=r.bundle_index,
                num_gpus=r.num_gpus,
                num_cpus=r.num_cpus,
                resources=r.resources,
                python=r.python,
                bundle_indices=r.bundle_indices,
                child_share=r.child_share,
                device_uuids=r.device_uuids,
                pci_bus_ids=r.pci_bus_ids,
                ray_sets_devices=r.ray_sets_devices,
                placement_group_id=groups[r.slot],
                capture_child_tasks=self.capture_child_tasks,
                env={**common, **r.env},
                epoch=r.epoch or self.epoch,
                uid=self.uid,
                accelerator=self.accelerator,
            )
            for r in self.rows
        ]


class Published(msgspec.Struct, frozen=True, kw_only=True):
    """Every component's assignments of one reservation epoch."""

    job: str
    uid: str
    epoch: int
    components: dict[str, ComponentBlock]


def _block(res: ReservationRecord, name: str, items: list[Assignment]) -> ComponentBlock:
    slots = {s.group_id: i for i, s in enumerate(res.slots)}
    common = dict(items[0].env) if items else {}
    for a in items[1:]:
        env = a.env
        for k in [k for k, v in common.items() if env.get(k) != v]:
            del common[k]
    rows = [
        Row(
            placement=a.placement,
            slot=slots[a.placement_group_id],
            bundle_index=a.bundle_index,
            num_gpus=a.num_gpus,
            num_cpus=a.num_cpus,
            env={k: v for k, v in a.env.items() if k not in common},
            resources=a.resources,
            python=a.python,
            bundle_indices=a.bundle_indices,
            child_share=a.child_share,
            device_uuids=a.device_uuids,
            pci_bus_ids=a.pci_bus_ids,
            ray_sets_devices=a.ray_sets_devices,
            epoch=a.epoch if a.epoch != res.epoch else 0,
        )
        for a in items
    ]
    return ComponentBlock(
        job=res.job,
        uid=res.uid,
        epoch=res.epoch,
        component=name,
        capture_child_tasks=items[0].capture_child_tasks if items else False,
        accelerator=res.spec.accelerator,
        groups=[s.group_id for s in res.slots],
        env=common,
        rows=rows,
    )


def _unchanged(new: Assignment, old: Assignment) -> bool:
    """Whether ``new`` is ``old`` made again at a later epoch: nothing but the epoch
    differs."""
    if new.uid != old.uid or "PLACECTL_EPOCH" not in old.env:
        return False
    aged = msgspec.structs.replace(
        new, epoch=old.epoch, env={**new.env, "PLACECTL_EPOCH": old.env["PLACECTL_EPOCH"]}
    )
    return aged == old


def publish(res: ReservationRecord, plan: JobPlan, previous: Published | None = None) -> Published:
    """The assignments of ``res``'s current epoch, ready to be written for drivers.

    With ``previous`` (the assignments published before, of the same reservation), a
    rank whose assignment differs from its previous one only by the epoch keeps the
    previous one byte for byte, epoch included: a worker of an untouched rank is not
    told it is stale by a change elsewhere in the job.
    """
    built = build_assignments(res, plan)
    if previous is not None and previous.uid == res.uid:
        for name, items in built.items():
            block = previous.components.get(name)
            if block is None:
                continue
            before = block.assignments()
            built[name] = [
                before[r] if r < len(before) and _unchanged(a, before[r]) else a
                for r, a in enumerate(items)
            ]
    return Published(
        job=res.job,
        uid=res.uid,
        epoch=res.epoch,
        components={name: _block(res, name, items) for name, items in built.items()},
    )


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
    copies: int = -1  # a held spare: the node rank whose slots (and standbys) it copies


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
    spares_short: str = ""  # why it holds fewer than it asks ("" when it holds them all)

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
        leaving={x.node_id: x.remove_at for x in res.leaving if x.remove_at != UNTIL_BACK},
        slots=[_slot(res, s) for s in res.slots],
        spares=[_slot(res, s, copied_rank(res, s)) for s in res.spares],
        spares_wanted=res.spec.spares,
        spares_short=res.spares_short,
    )


def _slot(res: ReservationRecord, s: SlotRecord, copies: int = -1) -> SlotInfo:
    return SlotInfo(
        copies=copies,
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
