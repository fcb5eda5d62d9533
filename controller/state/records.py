"""The persisted records of a reservation.

A reservation holds placement groups called slots, each on one node: a new reservation
has one per node it uses, and ``apply`` adds a slot beside the kept ones when a node's
share of the job grows. Each slot's bundles are one per accelerator (``{ACCEL: 1,
"CPU": c}``), one per hardware unit, and one CPU bundle for node-level processes; a
bundle lives in exactly one slot, and a process's bundles all lie in one slot. Records
are frozen: every change makes a new record, which is written to the GCS before it
replaces the old one in memory.

Only additive changes (new fields with defaults) keep ``SCHEMA_VERSION``; anything else
raises it and adds a migration in :mod:`controller.state.table`. Version 3: a node may
hold several slots, a record may carry an ``applying`` intent, and a published rank
carries the epoch it was last changed in (version 2 records read as version 3).
"""

from __future__ import annotations

import msgspec

from controller.planning.cluster import NodeView
from controller.planning.node_groups import ACCELERATOR
from controller.planning.spec import ClusterSpec
from controller.state.causes import NODE_LOST
from controller.state.leases import MASTER, CoreLease, PortLease

SCHEMA_VERSION = 3

PENDING, READY, DEGRADED, RELEASING = "pending", "ready", "degraded", "releasing"
QUEUED = "queued"  # waiting in a queue for admission: no groups, no slots yet
STATES = (QUEUED, PENDING, READY, DEGRADED, RELEASING)
AUTO, MANUAL = "auto", "manual"  # repair policies
GROUP_PREFIX = "placectl:"  # + controller name + ":" + job + ":" + token + ":" + slot


class BundleRecord(msgspec.Struct, frozen=True):
    """One bundle of a slot's placement group.

    Attributes:
        kind: ``accelerator``, ``hardware`` or ``node``.
        local_index: planned node-local index (-1 for the node bundle).
        resources: what the bundle asks Ray for.
        physical_id: the accelerator id the probe saw (-1 until probed, or none).
        uuid, pci_bus_id: the device's identity where the hardware tells it (NVIDIA);
            empty on fake GPUs and other accelerators.
    """

    kind: str
    local_index: int
    resources: dict[str, float]
    physical_id: int = -1
    uuid: str = ""
    pci_bus_id: str = ""


class SlotRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One placement group of a job, on one node."""

    node_rank: int
    node_id: str
    node_ip: str
    group_name: str
    group_id: str = ""
    bundles: list[BundleRecord] = []

    def bundle_index(self, kind: str, local_index: int, hardware: str = "") -> int:
        for i, b in enumerate(self.bundles):
            matches = b.kind == kind and b.local_index == local_index
            if matches and (not hardware or hardware in b.resources):
                return i
        raise KeyError((kind, local_index, hardware))

    def need(self) -> dict[str, float]:
        """The resources of all bundles together."""
        total: dict[str, float] = {}
        for b in self.bundles:
            for k, v in b.resources.items():
                total[k] = total.get(k, 0.0) + v
        return total


class Applying(msgspec.Struct, frozen=True, kw_only=True):
    """An ``apply`` in progress, written before it creates anything: a controller that
    restarts with it rolls the reservation back to the record it is attached to.

    Attributes:
        epoch: the epoch the applied reservation will have.
        group_names: the groups the apply creates (removed on rollback).
        removed: group ids of slots it removes before creating their replacement on the
            same node (a rebuild on a full node); the record still lists them until the
            apply completes, and a rollback leaves them for the repair to make again.
    """

    epoch: int
    group_names: list[str] = []
    removed: list[str] = []


class LeavingGroup(msgspec.Struct, frozen=True, kw_only=True):
    """A group whose slot moved off a draining node, kept until the node goes so the
    workers still running in it can finish their step and move at a boundary.

    Attributes:
        group_id: the placement group.
        node_id: the draining node it is on.
        remove_at: when placectl removes it (wall-clock seconds): the drain's deadline,
            or a grace after the move when the drain named none.
    """

    group_id: str
    node_id: str
    remove_at: float


class ReservationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A job's reservation as persisted.

    Attributes:
        v: the schema version the record was written with.
        job: the job name.
        uid: new at every creation of the job name; a change means a new reservation.
        epoch: grows whenever assignments may change, and never falls for a job name
            (a new reservation of the same name continues the count).
        spec: the configuration.
        nodes: the nodes the reservation uses, by cluster node rank (not the whole
            cluster: a record grows with its job, not with the cluster).
        floating: node ranks chosen for floating node groups.
        slots: the placement groups, in node-rank order (several on a node after an
            ``apply`` grew it).
        world_sizes: processes per component, in configuration order.
        state, reason: queued | pending | ready | degraded | releasing, and why.
        cause: why it is degraded, as data (:mod:`controller.state.causes`); kept while
            it is degraded, whatever its reason says as a repair goes on.
        repair: ``auto`` (replace lost slots at once) or ``manual`` (wait for
            ``repair(job)``).
        leases: master ports first, then ports leased on request.
        cores: the CPU units engine ranks leased on their nodes
            (:mod:`controller.state.leases`).
        applying: an ``apply`` in progress (None otherwise).
        queue, priority, queued_at: the queue a reservation was asked for in (``""``:
            none), its priority there (higher first) and when it joined (wall clock,
            first come first served within a priority). Kept once admitted.
        owner: a hash of the creating client's token; "" when anyone may change it
            (see :mod:`controller.state.owners`).
        preemptible: a queued reservation of higher priority may take it back.
        preempt_grace: how long it keeps running once preempted (0: the controller's
            default).
        preempt_at: when it is being taken back, the wall-clock deadline at which it
            is released (0: it is not).
        leaving: groups of slots moved off draining nodes, removed when their node goes
            (no longer part of the reservation's slots; removed with it on release).
        spares: groups held on spare nodes for repairs (``cluster.spares``), each with
            the bundles of one node's slots (node rank -1); a repair makes one a slot.
    """

    v: int = SCHEMA_VERSION
    job: str
    uid: str
    epoch: int = 1
    spec: ClusterSpec
    nodes: dict[int, NodeView] = {}
    floating: dict[str, list[int]] = {}
    slots: list[SlotRecord] = []
    world_sizes: dict[str, int] = {}
    state: str = PENDING
    reason: str = ""
    cause: str = ""  # why it is degraded (controller.state.causes); "" when it is not
    repair: str = AUTO
    created_at: float = 0.0
    leases: list[PortLease] = []
    cores: list[CoreLease] = []
    applying: Applying | None = None
    queue: str = ""
    priority: int = 0
    queued_at: float = 0.0
    owner: str = ""
    preemptible: bool = False
    preempt_grace: float = 0.0
    preempt_at: float = 0.0
    leaving: list[LeavingGroup] = []
    spares: list[SlotRecord] = []

    def master_port(self, component: str) -> int | None:
        for lease in self.leases:
            if lease.component == component and lease.purpose == MASTER:
                return lease.ports[0]
        return None

    def accelerators(self) -> int:
        return sum(1 for s in self.slots for b in s.bundles if b.kind == ACCELERATOR)

    def group_ids(self) -> set[str]:
        """The ids of its groups: its slots', its held spares' and those still leaving
        draining nodes."""
        held = {s.group_id for s in (*self.slots, *self.spares) if s.group_id}
        return held | {g.group_id for g in self.leaving}

    def node_ids(self) -> set[str]:
        return {s.node_id for s in self.slots}

    @property
    def settled(self) -> bool:
        return self.state in (READY, DEGRADED)


def with_dead_nodes(record: ReservationRecord, dead: set[str]) -> ReservationRecord:
    """``record`` as it stands when the nodes ``dead`` are dead (as Ray reports them).

    A settled reservation holding one of them is ``degraded``, whatever its stored state
    says: the controller may not have written it yet, and a reader must never take a
    bundle on a dead node for a good one. Otherwise ``record`` itself.
    """
    lost = [s for s in record.slots if s.node_id in dead]
    if not lost or record.state != READY:
        return record
    named = ", ".join(sorted({f"{s.node_ip} ({s.node_id[:12]})" for s in lost}))
    return msgspec.structs.replace(
        record,
        state=DEGRADED,
        reason=f"Ray reports node {named} dead; its slot is not replaced yet",
        cause=NODE_LOST,
    )
