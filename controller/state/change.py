"""Changing a live reservation: who may, and what applying a new configuration changes,
computed without Ray.

Node ranks stay bound to the nodes the reservation holds: the new configuration is
planned on a view where each held rank is its node and the other ranks are the remaining
alive nodes in node-rank order. On each node:

* a slot (placement group) is **kept** whole when every bundle it holds is still needed
  with the same resources: same group, same bundles, same physical ids;
* the bundles the new plan adds go into **one new slot** per node;
* a slot holding a bundle that is no longer needed is **removed**; the bundles of it that
  are still needed are made again in the node's new slot (a **rebuild**), and the
  processes on them move;
* a process whose accelerators would lie in several slots makes them one new slot (Ray
  places a process and its children in one group), rebuilding what it spans.

**Owners**: who may change a reservation.

A reservation records its owner as a hash of a token its creating client keeps (the
token itself is never stored or logged). ``release``, ``apply``, ``resize``, ``repair``,
port leases and a ``reserve`` that replaces another spec need that token, or ``force``;
reading and attaching stay open. Ray has no authentication inside a cluster, so this
guards against mistakes (a colleague's ``placectl release --all``), not against attackers:
anyone who can run code in the cluster can read the table or kill the controller.
"""

from __future__ import annotations

import hashlib
import logging

import msgspec

from controller.errors import NotOwner, ReservationError
from controller.planning.cluster import ClusterView, NodeView
from controller.planning.node_groups import ACCELERATOR
from controller.planning.placement import Placement
from controller.state.plan import BundleKey, JobPlan, bundle_key, bundles_by_node, ordered
from controller.state.records import BundleRecord, ReservationRecord, SlotRecord

STAYS, MOVES, STARTS, STOPS = "stays", "moves", "starts", "stops"


class ComponentChange(msgspec.Struct, frozen=True, kw_only=True):
    """What an apply does to one component's ranks.

    Attributes:
        stays: ranks that keep running where they are: same node, bundles and devices,
            a share no smaller (their assignment may still change: a larger share, a new
            world size, which a process started anew would use).
        moves: ranks that exist before and after but run elsewhere or differently.
        starts, stops: ranks that are new, or gone.
        restart: why the component needs a new process group ("" if it does not):
            its world size changed or its rank 0 moved.
    """

    name: str
    old_world_size: int
    new_world_size: int
    stays: list[int] = []
    moves: list[int] = []
    starts: list[int] = []
    stops: list[int] = []
    restart: str = ""


class ApplySummary(msgspec.Struct, frozen=True, kw_only=True):
    """What an apply did, or would do (``applied`` False for a dry run)."""

    job: str
    epoch: int  # the epoch after the apply
    applied: bool
    components: list[ComponentChange] = []
    slots_kept: int = 0
    slots_created: int = 0
    slots_removed: int = 0
    rebuilt_nodes: list[int] = []  # node ranks whose kept bundles were made again
    note: str = ""


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """The slots of an applied reservation and how to get there from the old ones.

    Attributes:
        plan: the new plan.
        nodes: the nodes the new plan uses, by node rank.
        kept: indices (into the old record's slots) of slots kept as they are.
        created: new slots, not yet made (no group id, no physical ids).
        removed: indices of old slots to remove.
        rebuilt: for each created slot that remakes bundles of removed slots, the indices
            of those slots (they hold resources the new slot needs on the same node).
        summary: the change per component.
    """

    plan: JobPlan
    nodes: dict[int, NodeView]
    kept: list[int]
    created: list[SlotRecord]
    removed: list[int]
    rebuilt: dict[int, list[int]]  # index into created -> old slot indices
    summary: ApplySummary


def bound_view(res: ReservationRecord, live: ClusterView) -> ClusterView:
    """The cluster as the new plan sees it: each node rank the reservation holds is its
    node (as Ray reports it now); the other ranks are the other alive nodes, in order.

    Raises:
        ReservationError: a node the reservation holds is not alive, or too few other
            nodes are alive to fill the ranks below the ones it holds.
    """
    now = {n.node_id: n for n in live.nodes}
    held = {}
    for rank, node in res.nodes.items():
        if node.node_id not in now:
            raise ReservationError(
                f"node rank {rank} of {res.job!r} ({node.ip}) is not alive; repair the "
                "reservation before applying a new configuration"
            )
        held[rank] = now[node.node_id]
    mine = {n.node_id for n in held.values()}
    others = iter(n for n in live.nodes if n.node_id not in mine)
    nodes: list[NodeView] = []
    for rank in range(max(len(live.nodes), max(held, default=-1) + 1)):
        node = held.get(rank) or next(others, None)
        if node is None:
            if rank < max(held, default=-1):
                raise ReservationError(
                    f"the cluster has {len(live.nodes)} alive nodes, too few to keep "
                    f"{res.job!r}'s node ranks {sorted(held)} in place"
                )
            break
        nodes.append(node)
    return ClusterView(nodes=nodes)


def _same_place(old: Placement, new: Placement) -> bool:
    """A process that can keep running: same node, resources, devices seen, and shares
    no smaller than before (a process that keeps a larger share than the new plan gives
    it would leave no room for the holders the plan adds)."""
    fields = (
        "node_rank",
        "kind",
        "hardware",
        "node_group",
        "local_resource_ranks",
        "cuda_visible_devices",
        "isolate_gpu",
    )
    return (
        all(getattr(old, f) == getattr(new, f) for f in fields)
        and new.accelerator_share >= old.accelerator_share
        and new.child_share >= old.child_share
    )


def _keys_of(p: Placement) -> list[BundleKey]:
    """The bundles a process starts in (a process and its children need one group)."""
    if p.kind == ACCELERATOR:
        return [(ACCELERATOR, "", g) for g in p.local_resource_ranks]
    local = p.local_resource_ranks[0] if p.local_resource_ranks else -1
    return [(p.kind, p.hardware or "", local)]


def plan_slots_change(
    res: ReservationRecord, old_plan: JobPlan, new_plan: JobPlan, view: ClusterView, prefix: str
) -> Change:
    """Which slots stay, go and come when ``res`` (planned as ``old_plan``) becomes
    ``new_plan`` on ``view`` (see :func:`bound_view`). New slots are named
    ``f"{prefix}{i}"``.

    Raises:
        ReservationError: the new plan uses a node rank the view does not have.
    """
    required = bundles_by_node(new_plan, res.spec)
    spans: dict[int, list[set[BundleKey]]] = {}
    for comp in new_plan.components:
        for p in comp.placements:
            keys = _keys_of(p)
            if len(keys) > 1:
                spans.setdefault(p.node_rank, []).append(set(keys))
    kept: list[int] = []
    created: list[SlotRecord] = []
    removed: list[int] = []
    rebuilt: dict[int, list[int]] = {}
    ranks = sorted({s.node_rank for s in res.slots} | set(required))
    for nr in ranks:
        if nr >= len(view.nodes):
            raise ReservationError(
                f"the new configuration uses node rank {nr}; the cluster has "
                f"{len(view.nodes)} alive nodes"
            )
        need = required.get(nr, {})
        mine = [(i, s) for i, s in enumerate(res.slots) if s.node_rank == nr]
        unit: dict[BundleKey, int] = {}
        for i, s in mine:
            keys = [bundle_key(b) for b in s.bundles]
            if all(need.get(k) == b.resources for k, b in zip(keys, s.bundles, strict=True)):
                unit.update(dict.fromkeys(keys, i))
        changed = True
        while changed:  # a process spanning units makes them one new slot
            changed = False
            for keys in spans.get(nr, []):
                units = {unit.get(k, -1) for k in keys}
                if len(units) > 1:
                    for u in units - {-1}:
                        for k in [k for k, v in unit.items() if v == u]:
                            del unit[k]
                    changed = True
        keep = sorted(set(unit.values()))
        gone = [i for i, _ in mine if i not in keep]
        fresh = ordered(k for k in need if k not in unit)
        kept += keep
        removed += gone
        if fresh:
            node = view.nodes[nr]
            again = [i for i in gone if {bundle_key(b) for b in res.slots[i].bundles} & set(fresh)]
            if again:
                rebuilt[len(created)] = again
            created.append(
                SlotRecord(
                    node_rank=nr,
                    node_id=node.node_id,
                    node_ip=node.ip,
                    group_name=f"{prefix}{len(created)}",
                    bundles=[BundleRecord(k[0], k[2], need[k]) for k in fresh],
                )
            )
    nodes = {nr: view.nodes[nr] for nr in new_plan.node_ranks()}
    kept_slots = [res.slots[i] for i in kept]
    kept_keys = {(s.node_rank, bundle_key(b)) for s in kept_slots for b in s.bundles}
    summary = _summarize(res, old_plan, new_plan, kept_keys)
    summary = msgspec.structs.replace(
        summary,
        slots_kept=len(kept),
        slots_created=len(created),
        slots_removed=len(removed),
        rebuilt_nodes=sorted({created[c].node_rank for c in rebuilt}),
    )
    return Change(
        plan=new_plan,
        nodes=nodes,
        kept=kept,
        created=created,
        removed=removed,
        rebuilt=rebuilt,
        summary=summary,
    )


def _summarize(
    res: ReservationRecord,
    old_plan: JobPlan,
    new_plan: JobPlan,
    kept_keys: set[tuple[int, BundleKey]],
) -> ApplySummary:
    old = {c.name: c.placements for c in old_plan.components}
    out = []
    for comp in new_plan.components:
        before = old.pop(comp.name, [])
        after = comp.placements
        ch = {STAYS: [], MOVES: [], STARTS: [], STOPS: []}
        for r, p in enumerate(after):
            if r >= len(before):
                ch[STARTS].append(r)
            elif _same_place(before[r], p) and all(
                (p.node_rank, k) in kept_keys for k in _keys_of(p)
            ):
                ch[STAYS].append(r)
            else:
                ch[MOVES].append(r)
        ch[STOPS] = list(range(len(after), len(before)))
        restart = ""
        if before and len(before) != len(after):
            restart = f"world size {len(before)} -> {len(after)}"
        elif before and 0 not in ch[STAYS]:
            restart = "rank 0 moved"
        out.append(
            ComponentChange(
                name=comp.name,
                old_world_size=len(before),
                new_world_size=len(after),
                stays=ch[STAYS],
                moves=ch[MOVES],
                starts=ch[STARTS],
                stops=ch[STOPS],
                restart=restart,
            )
        )
    for name, before in old.items():  # components the new configuration drops
        out.append(
            ComponentChange(
                name=name,
                old_world_size=len(before),
                new_world_size=0,
                stops=list(range(len(before))),
            )
        )
    return ApplySummary(job=res.job, epoch=res.epoch + 1, applied=False, components=out)


def owner_hash(token: str) -> str:
    """What the table keeps of a token ("" for none: the reservation is anyone's)."""
    if not token:
        return ""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def owns(record: ReservationRecord, token: str) -> bool:
    """Whether ``token`` may change ``record`` (a record without an owner: anyone)."""
    return not record.owner or owner_hash(token) == record.owner


def check_owner(record: ReservationRecord, token: str, force: bool, what: str) -> bool:
    """Allow ``what`` on ``record``; True when it is allowed only because of ``force``.

    Raises:
        NotOwner: the caller does not hold the owner's token and did not force it.
    """
    if owns(record, token):
        return False
    if force:
        return True
    raise NotOwner(
        f"{what} of {record.job!r} refused: it was reserved by another client (a different "
        "placectl token); use its owner's token (PLACECTL_TOKEN) or force=True (--force)"
    )


class Caller(msgspec.Struct, frozen=True):
    """Who asks for a change of a reservation. The operation checks it against the
    record it reads under the job's lock, so the record it changes is the record whose
    owner was checked (a check before the lock could pass on a job that did not exist
    yet, then change the one another client reserved meanwhile).

    Attributes:
        token: the caller's token ("" for none).
        force: change it even without the owner's token (logged).
    """

    token: str = ""
    force: bool = False

    def may(self, record: ReservationRecord, what: str) -> None:
        """Allow ``what`` on ``record``.

        Raises:
            NotOwner: the caller does not hold the owner's token and did not force it.
        """
        if check_owner(record, self.token, self.force, what):
            logging.getLogger("placectl.controller").warning(
                "%s of %r forced by a caller without its owner's token", what, record.job
            )


__all__ = ["Caller", "check_owner", "owner_hash", "owns"]
