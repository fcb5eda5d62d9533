"""The persisted records: a reservation and its slots, why one is degraded (its cause),
and the nodes an operator cordoned.

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

**Causes**: why a reservation is degraded, as data.

A cause is named once, where the break is found (:func:`controller.runtime.core.groups.broken_slots`
for each slot, the drain watch for a move), and carried from there: by the record while it
is degraded (``ReservationRecord.cause``; its human reason may change as a repair goes on,
the cause does not), by the ``degraded`` and ``repaired`` events, and by the metrics'
``cause`` label. Nothing reads a cause back out of a message, but for records written
before the cause was kept (:func:`legacy_cause`).

**Cordons**: nodes an operator took out of placement (``placectl cordon``, ``placectl drain``).

A cordoned node gets no new slot: no plan, spare or repair picks it, while the slots
already there stay. A drained one is cordoned and, besides, every reservation with a
slot there moves off it, make before break, as for Ray's own drain (a spot notice): the
replacement is placed and ready before the old group goes. Unlike Ray's drain, the node
stays in the cluster for other work, and ``placectl uncordon`` gives it back.

Kept in the table (one key per node), so a controller restart keeps them.
"""

from __future__ import annotations

from collections.abc import Container

import msgspec

from controller.planning.cluster import NodeView
from controller.planning.node_groups import ACCELERATOR
from controller.planning.spec import ClusterSpec
from controller.state.causes import NODE_LOST, NODE_SUSPECTED
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
    # A held spare (node_rank -1): the node rank whose slots it copies, so that its
    # standbys are that node's (controller.state.spares.spare_ranks); -1 in a slot, and
    # in a spare held before spares had kinds (it copies the fullest node).
    copies: int = -1

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


# A group kept until its node answers again (remove_at): see LeavingGroup.
UNTIL_BACK = float("inf")


class LeavingGroup(msgspec.Struct, frozen=True, kw_only=True):
    """A group whose slot moved off its node, kept for a while:

    * off a draining node, until the node goes, so the workers still running in it can
      finish their step and move at a boundary;
    * off a suspect (silent, witnessed: its node is away), until the node answers again
      or is gone (``remove_at`` is :data:`UNTIL_BACK`): removing a group, or killing the
      actors in it, has Ray's GCS send the node's raylet requests that cannot arrive,
      on the connection its health checks use, and after a cut of 30 s that connection
      stayed stuck in TCP's retransmission backoff past the heal until the GCS declared
      the node dead (measured on hosts in network namespaces, Ray 2.60).

    Attributes:
        group_id: the placement group.
        node_id: the node it is on.
        remove_at: when placectl removes it (wall-clock seconds): the drain's deadline,
            or a grace after the move when the drain named none; or never by the clock.
    """

    group_id: str
    node_id: str
    remove_at: float

    def due(self, now: float, alive: Container[str], away: Container[str]) -> bool:
        """Whether to remove it now: its time came, its node is gone, or (kept for a
        suspect) its node is no longer ``away``."""
        if self.node_id not in alive or self.remove_at <= now:
            return True
        return self.remove_at == UNTIL_BACK and self.node_id not in away


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
        cause: why it is degraded, as data (:mod:`controller.state.records`); kept while
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
            (see :mod:`controller.state.change`).
        preemptible: a queued reservation of higher priority may take it back.
        preempt_grace: how long it keeps running once preempted (0: the controller's
            default).
        preempt_at: when it is being taken back, the wall-clock deadline at which it
            is released (0: it is not).
        leaving: groups of slots moved off draining nodes, removed when their node goes
            (no longer part of the reservation's slots; removed with it on release).
        spares: groups held on spare nodes for repairs (``cluster.spares``), each with
            the bundles of one node's slots (node rank -1); a repair makes one a slot.
        spares_short: why it holds fewer spares than it asks (its queue's quota, no
            free node of the kind); "" when it holds them all or has not tried yet.
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
    cause: str = ""  # why it is degraded (controller.state.records); "" when it is not
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
    spares_short: str = ""

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


def with_dead_nodes(
    record: ReservationRecord, dead: set[str], suspected: set[str] = frozenset()
) -> ReservationRecord:
    """``record`` as it stands when the nodes ``dead`` are dead (as Ray reports them)
    and the nodes ``suspected`` do not answer (their slots move).

    A settled reservation holding one of them is ``degraded``, whatever its stored state
    says: the controller may not have written it yet, and a reader must never take a
    bundle on a dead node for a good one. Otherwise ``record`` itself.
    """
    lost = [s for s in record.slots if s.node_id in dead]
    doubted = [s for s in record.slots if s.node_id in suspected and s.node_id not in dead]
    if not (lost or doubted) or record.state != READY:
        return record
    if lost:
        named = ", ".join(sorted({f"{s.node_ip} ({s.node_id[:12]})" for s in lost}))
        reason, cause = f"Ray reports node {named} dead; its slot is not replaced yet", NODE_LOST
    else:
        named = ", ".join(sorted({f"{s.node_ip} ({s.node_id[:12]})" for s in doubted}))
        reason = f"node {named} does not answer (suspected); its slot is not moved yet"
        cause = NODE_SUSPECTED
    return msgspec.structs.replace(record, state=DEGRADED, reason=reason, cause=cause)


class Cordon(msgspec.Struct, frozen=True, kw_only=True):
    """One node out of placement, and why.

    Attributes:
        node_id: the node (Ray's id).
        ip: its address when cordoned, as operators name nodes.
        drain: its slots move off too (not only new ones kept away).
        why: the operator's reason, shown in ``placectl status`` and the history.
        at: when (wall-clock seconds).
    """

    node_id: str
    ip: str = ""
    drain: bool = False
    why: str = ""
    at: float = 0.0

    def where(self) -> str:
        """``10.0.0.3 (1a2b3c4d5e6f)``."""
        return f"{self.ip} ({self.node_id[:12]})" if self.ip else self.node_id[:12]

    def shown(self) -> str:
        """``10.0.0.3 (1a2b3c4d5e6f) drained: a GPU throws Xid 79``."""
        how = "drained" if self.drain else "cordoned"
        return f"node {self.where()} {how}" + (f": {self.why}" if self.why else "")


def resolve(name: str, nodes: dict[str, str], what: str = "alive") -> str:
    """The node id ``name`` names among ``nodes`` (node id -> address), the ``what``
    nodes: a full id, a unique prefix of one (8 characters at least), or an address
    held by one node.

    Raises:
        ValueError: no node, or more than one, answers to ``name``; the message says
            what names are taken.
    """
    if name in nodes:
        return name
    by_ip = [n for n, ip in nodes.items() if ip == name]
    if len(by_ip) == 1:
        return by_ip[0]
    if len(by_ip) > 1:
        ids = ", ".join(sorted(n[:12] for n in by_ip))
        raise ValueError(
            f"node {name!r}: {len(by_ip)} {what} nodes have that address ({ids}); "
            "name one by its id"
        )
    if len(name) >= 8:
        by_id = [n for n in nodes if n.startswith(name)]
        if len(by_id) == 1:
            return by_id[0]
        if len(by_id) > 1:
            raise ValueError(f"node {name!r}: the prefix of {len(by_id)} node ids; give more of it")
    raise ValueError(
        f"node {name!r}: no {what} node has that id or address; expected a node id (or its "
        "first 8 characters or more) or an address, as `ray list nodes` shows them"
    )


__all__ = [
    "UNTIL_BACK",
    "Cordon",
    "resolve",
]
