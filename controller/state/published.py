"""Assignments as they are stored for drivers: one GCS key per component and epoch.

A rank's full environment is its component's common variables plus its own; storing
them apart keeps a 1,000-rank component's key near half the size, and a driver decodes
only the component it asks for.
"""

from __future__ import annotations

import msgspec

from controller.planning.placement import Placement
from controller.state.assignments import Assignment, build_assignments
from controller.state.plan import JobPlan
from controller.state.records import SCHEMA_VERSION, ReservationRecord


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
