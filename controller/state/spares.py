"""Which live node may stand in for a lost one: the same kind, with room for the slot,
nearest first (the same NVLink domain, then the same rack)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import msgspec

from controller.planning.cluster import NODE_RANK_LABEL, NodeView
from controller.planning.node_groups import ACCELERATOR
from controller.planning.spec_model import ClusterSpec
from controller.planning.topology import (
    NVLINK_RESOURCE_PREFIX,
    RACK_LABEL,
    TOPO_RANK_LABEL,
    TOPO_RANK_RESOURCE,
    place_of,
)
from controller.state.assignments import build_assignments
from controller.state.plan import JobPlan
from controller.state.records import BundleRecord, ReservationRecord, SlotRecord

# Ray's labels that say what a node is (not which node): a spare must match them.
KIND_LABELS = ("ray.io/accelerator-type", "ray.io/node-group", "ray.io/market-type")
# Labels that say where a node is, not what it is: nearness, not kind.
PLACE_LABELS = (NODE_RANK_LABEL, RACK_LABEL, TOPO_RANK_LABEL)


def _kind_resources(node: NodeView) -> dict[str, float]:
    return {
        k: v
        for k, v in node.resources.items()
        if not k.startswith(NVLINK_RESOURCE_PREFIX) and k != TOPO_RANK_RESOURCE
    }


def kind_labels(node: NodeView) -> dict[str, str]:
    """The labels that describe the kind of a node: Ray's kind labels and every user
    label except those that name one node or its place (``ray.io/*`` ids, zones and
    domains, the rank, rack and topology-rank labels)."""
    return {
        k: v
        for k, v in node.labels.items()
        if (k in KIND_LABELS or not k.startswith("ray.io/")) and k not in PLACE_LABELS
    }


def is_replacement(dead: NodeView, candidate: NodeView) -> bool:
    """Whether ``candidate`` is the same kind of node as ``dead``: the same accelerators,
    custom resources (``accelerator_type:*`` included; NeMo-RL's per-node topology
    resources are where a node is, not what it is) and kind labels."""
    return (
        candidate.num_gpus == dead.num_gpus
        and _kind_resources(candidate) == _kind_resources(dead)
        and kind_labels(candidate) == kind_labels(dead)
    )


def nearness(dead: NodeView, candidate: NodeView) -> tuple[int, int]:
    """How far ``candidate`` is from ``dead`` in the interconnect: (0, _) in the same
    NVLink domain, then (_, 0) in the same rack; unknown counts as far."""
    a, b = dead.topology, candidate.topology
    return (
        0 if a.domain and a.domain == b.domain else 1,
        0 if a.rack and a.rack == b.rack else 1,
    )


def matches(node: NodeView, selectors: Iterable[dict[str, str]]) -> bool:
    """Whether ``node``'s labels satisfy every selector (a floating group's)."""
    return all(node.labels.get(k) == v for sel in selectors for k, v in sel.items())


class Keep(msgspec.Struct, frozen=True, kw_only=True):
    """A lost node's spare must be in the same NVLink domain (or rack) as it was.

    Attributes:
        within: ``nvlink-domain`` or ``rack``.
        place: the domain (or rack) it was in.
        component: the component whose segment it holds (``topology.on_loss: wait``).
        segment: that component's segment size.
    """

    within: str
    place: str
    component: str
    segment: int

    def describe(self) -> str:
        noun = "NVLink domain" if self.within == "nvlink-domain" else "rack"
        return (
            f"in {noun} {self.place} ({self.component} keeps topology.segment "
            f"{self.segment} within {self.within}; on_loss: span would take one elsewhere)"
        )


def segments_kept(spec: ClusterSpec, plan: JobPlan, node_rank: int, lost: NodeView) -> list[Keep]:
    """What a spare for the node at ``node_rank`` must share with ``lost``: the domain (or
    rack) of every segment of a ``wait`` component that has a process there."""
    keeps = []
    for comp in spec.components:
        rule = comp.topology
        if rule is None or rule.on_loss != "wait":
            continue
        placements = plan.component(comp.name).placements
        if any(p.node_rank == node_rank for p in placements):
            place = place_of(lost.topology, rule.within)
            if place:
                keeps.append(
                    Keep(within=rule.within, place=place, component=comp.name, segment=rule.segment)
                )
    return keeps


def failure_domain(node: NodeView) -> str:
    """What fails with ``node`` (a power feed, a top-of-rack switch): its rack
    (``placectl.io/rack``), else its NVLink domain; "" when it states neither."""
    return node.topology.rack or node.topology.domain


def apart_from(res: ReservationRecord) -> frozenset[str]:
    """The failure domains of ``res``'s nodes: where a held spare, to outlive the loss of
    one of them, is not put while a node elsewhere will do."""
    return frozenset(d for n in res.nodes.values() if (d := failure_domain(n)))


def choose_spare(
    dead: NodeView,
    candidates: list[NodeView],
    free: dict[str, dict[str, float]],
    need: dict[str, float],
    exclude: set[str],
    selectors: Iterable[dict[str, str]] = (),
    keep: Sequence[Keep] = (),
    busy: Mapping[str, int] = {},
    apart: Collection[str] = frozenset(),
) -> NodeView | None:
    """The nearest candidate (by :func:`nearness`, then the fewest groups other steps
    are making there now, ``busy``, then node-rank order) that can stand in for
    ``dead``: the same kind of node, matching ``selectors``, in every domain or rack
    ``keep`` names, not in ``exclude``, with ``need`` free. Among equally near nodes a
    busy one comes last: many repairs at once (a rack lost under many jobs) spread over
    nodes, whose probes then run side by side instead of in turn on one node.

    A node in one of the failure domains ``apart`` (:func:`failure_domain`) comes after
    every node outside them: a held spare kept out of its job's racks outlives the loss
    of one of them."""
    selectors = list(selectors)

    def order(n: NodeView) -> tuple:
        return (failure_domain(n) in apart, nearness(dead, n), busy.get(n.node_id, 0))

    for node in sorted(candidates, key=order):
        if node.node_id in exclude or not is_replacement(dead, node):
            continue
        if not matches(node, selectors):
            continue
        if any(place_of(node.topology, k.within) != k.place for k in keep):
            continue
        have = free.get(node.node_id, {})
        if all(have.get(k, 0.0) + 1e-9 >= v for k, v in need.items()):
            return node
    return None


# ---------------------------------------------------------------- held spares
# A reservation with ``cluster.spares: N`` holds N groups on spare nodes, each with the
# bundles of one node's slots. A repair that finds a held one fit for a lost node makes
# it that node's slot: nothing to schedule, place or probe, and no race with another
# job for the free node.


def selectors_for(res: ReservationRecord, node_rank: int) -> list[dict[str, str]]:
    """The selectors of the floating node groups that chose the node at ``node_rank``:
    a node standing in for it must match them."""
    return [
        dict(g.selector or {})
        for g in res.spec.node_groups
        if g.floating and node_rank in res.floating.get(g.label, [])
    ]


def need_of(bundles: Iterable[BundleRecord]) -> dict[str, float]:
    """What ``bundles`` ask of a node, together."""
    total: dict[str, float] = {}
    for b in bundles:
        for k, v in b.resources.items():
            total[k] = total.get(k, 0.0) + v
    return total


def usable_spares(
    res: ReservationRecord, live: Mapping[str, NodeView], draining: Iterable[str], placed: set[str]
) -> dict[str, NodeView]:
    """The nodes of ``res``'s held spares a repair may take now: alive (in ``live``), not
    draining, their group placed (its id in ``placed``)."""
    draining = set(draining)
    return {
        s.node_id: live[s.node_id]
        for s in res.spares
        if s.node_id in live and s.node_id not in draining and s.group_id in placed
    }


def node_bundles(res: ReservationRecord, node_rank: int) -> list[BundleRecord]:
    """The bundles of every slot of ``res`` on the node at ``node_rank``, in slot order:
    what one slot on a spare holds for them (a repair moves a node's slots together)."""
    return [b for s in res.slots if s.node_rank == node_rank for b in s.bundles]


def shape(bundles: Iterable[BundleRecord]) -> tuple:
    """What a group of ``bundles`` asks of Ray and where each bundle's process goes, not
    which devices it got: two groups of one shape stand in for each other."""
    return tuple((b.kind, b.local_index, tuple(sorted(b.resources.items()))) for b in bundles)


def _weight(res: ReservationRecord, rank: int) -> tuple[int, int, int]:
    """How full the node at ``rank`` is: its accelerator bundles, then its bundles, the
    lowest rank first among equals (a GPU node before a CPU head with a few node-level
    processes)."""
    bundles = node_bundles(res, rank)
    return sum(1 for b in bundles if b.kind == ACCELERATOR), len(bundles), -rank


def fullest_rank(res: ReservationRecord) -> int:
    """The node rank with the most accelerator bundles (:func:`_weight`), -1 for none."""
    ranks = sorted({s.node_rank for s in res.slots})
    return max(ranks, key=lambda r: _weight(res, r)) if ranks else -1


def spare_bundles(
    res: ReservationRecord, rank: int | None = None
) -> tuple[int, list[BundleRecord]]:
    """The node rank a held spare copies (``rank``; by default the fullest node,
    :func:`fullest_rank`), and that node's bundles as a new group asks for them."""
    rank = fullest_rank(res) if rank is None else rank
    fresh = [
        msgspec.structs.replace(b, physical_id=-1, uuid="", pci_bus_id="")
        for b in node_bundles(res, rank)
    ]
    return rank, fresh


def node_standbys(res: ReservationRecord, plan: JobPlan | None) -> dict[int, frozenset[str]]:
    """For each node rank of ``res``, the components with ``standby: true`` that have
    ranks there: what a spare copying that node runs standbys of."""
    out: dict[int, set[str]] = {s.node_rank: set() for s in res.slots}
    if plan is None:
        return {r: frozenset() for r in out}
    standby = {c.name for c in res.spec.components if c.standby}
    for component, items in build_assignments(res, plan).items():
        if component in standby:
            for a in items:
                out.setdefault(a.placement.node_rank, set()).add(component)
    return {r: frozenset(c) for r, c in out.items()}


def spare_ranks(res: ReservationRecord, plan: JobPlan | None) -> list[int]:
    """The node rank each of the ``cluster.spares`` held spares copies, in the order they
    are held. Nodes differ in which standbys they would run (the components with
    ``standby: true`` that have ranks on them): with trainers and rollout on nodes of
    their own, a trainer node's copy runs standby trainers, a rollout node's standby
    rollout. The spares take each such kind in turn, the fullest kind first (its
    fullest node); so one spare copies the fullest node, as without kinds, and two
    cover a trainer node and a rollout node. Without standbys, every spare copies the
    fullest node."""
    fullest = fullest_rank(res)
    if fullest < 0:
        return []
    content = node_standbys(res, plan)
    kinds: dict[frozenset[str], int] = {}
    for rank in sorted(content, key=lambda r: _weight(res, r), reverse=True):
        if content[rank]:
            kinds.setdefault(content[rank], rank)
    order = list(kinds.values()) or [fullest]
    return [order[i % len(order)] for i in range(res.spec.spares)]


def copied_rank(res: ReservationRecord, spare: SlotRecord) -> int:
    """The node rank ``spare`` copies: its own where it names one of ``res``'s nodes;
    the fullest node otherwise (a spare held before spares had kinds)."""
    ranks = {s.node_rank for s in res.slots}
    return spare.copies if spare.copies in ranks else fullest_rank(res)


def spares_like(res: ReservationRecord, plan: JobPlan | None, node_rank: int) -> set[int]:
    """The indexes in ``res.spares`` of the held spares that copy a node running the
    same standbys as the node at ``node_rank`` (none when it runs none): the spares
    whose standbys stand in for that node's ranks."""
    content = node_standbys(res, plan)
    want = content.get(node_rank, frozenset())
    if not want:
        return set()
    return {i for i, s in enumerate(res.spares) if content.get(copied_rank(res, s)) == want}


# When a lost node's slots may take a held spare (spare_use): before a free node, after
# one (only when no free node fits), or never (they wait for a free node).
FIRST, LAST, NEVER = "first", "last", "never"


def spare_use(res: ReservationRecord, plan: JobPlan | None, node_rank: int) -> str:
    """When the lost node ``node_rank`` may take a held spare. ``FIRST`` (nothing to
    place, the quickest), unless standbys wait on the spares (a component with
    ``standby: true``) and every rank on the node is of a component that runs short
    (``on_loss: continue``): those ranks lose only throughput while they wait, where
    taking the spare would cost the standbys' ranks their standbys at their next loss.
    Then ``NEVER``: a free node or one that joins; or ``LAST`` where one of them says
    ``take_spares: true``: a free node if one fits, else the spare. (A spare copying a
    node of the same kind, :func:`spares_like`, runs that node's own standbys: a repair
    takes it before asking this.)"""
    if plan is None or not any(c.standby for c in res.spec.components):
        return FIRST
    on = {
        name
        for name, items in build_assignments(res, plan).items()
        if any(a.placement.node_rank == node_rank for a in items)
    }
    comps = [res.spec.component(n) for n in on]
    if not comps or not all(c.runs_short for c in comps):
        return FIRST
    return LAST if any(c.take_spares for c in comps) else NEVER


def holds(spare: Iterable[BundleRecord], lost: Iterable[BundleRecord]) -> bool:
    """Whether a group of ``spare`` bundles can hold ``lost``'s processes: each lost
    bundle has a bundle of its kind and node-local index with at least its resources.
    The slot's ranks find their bundles by kind and local index
    (:meth:`SlotRecord.bundle_index`), so a spare with more bundles than the lost node
    had serves it, the rest of it idle."""
    have = {(b.kind, b.local_index): b.resources for b in spare}
    for b in lost:
        room = have.get((b.kind, b.local_index))
        if room is None or any(room.get(k, 0.0) + 1e-9 < v for k, v in b.resources.items()):
            return False
    return True


def held_for(
    res: ReservationRecord,
    dead: NodeView,
    bundles: list[BundleRecord],
    usable: Mapping[str, NodeView],
    exclude: set[str],
    selectors: Iterable[dict[str, str]] = (),
    keep: Sequence[Keep] = (),
    only: set[int] | None = None,
) -> int | None:
    """The index in ``res.spares`` (among ``only`` when given) of the held spare that
    stands in for the node ``dead`` and its slots' ``bundles``: on a node in ``usable``
    (alive, not draining, its group placed) that :func:`choose_spare` would take, able
    to hold ``bundles`` (:func:`holds`: by resources, not by which node it copied); one
    of their very shape first, so that a node with fewer bundles does not take the
    spare a whole node's loss would need, then the nearest. None when none fits."""
    want = shape(bundles)
    fits = {
        s.node_id: i
        for i, s in enumerate(res.spares)
        if s.node_id in usable and holds(s.bundles, bundles) and (only is None or i in only)
    }
    exact = [n for n, i in fits.items() if shape(res.spares[i].bundles) == want]
    for among in (exact, list(fits)):
        nodes = [usable[n] for n in among]
        free = {n: {} for n in among}  # its bundles are held already: room is not the question
        node = choose_spare(dead, nodes, free, {}, exclude, selectors, keep)
        if node is not None:
            return fits[node.node_id]
    return None
