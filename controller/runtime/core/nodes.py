"""The node view: the cluster's nodes as the controller knows them, and the one inbox
through which everything it learns of them arrives (:mod:`controller.runtime.core.inbox`).

Kept from what the loop follows (Ray's node events, full reads at joins and full checks,
direct questions about a reservation's nodes, the raylet watch), so that a reserve costs
what its job costs, not a read and a sort of the whole cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import msgspec

from controller.planning.cluster import ClusterView, NodeView, order_nodes
from controller.runtime import core
from controller.runtime.core import doubts
from controller.runtime.core.doubts import FINAL, NodeRecord
from controller.runtime.core.flaps import Flaps
from controller.runtime.core.inbox import Fact, Inbox, Kind, Source
from controller.runtime.edge import ClusterIO, NodeInfo
from controller.state.records import Cordon

log = logging.getLogger("placectl.controller")
_BOOKKEEPING = ("CPU", "memory", "object_store_memory")


def node_view(n: NodeInfo, accelerator: str) -> NodeView:
    """One node as the planner sees it."""
    custom = {
        k: v
        for k, v in n.resources.items()
        if k != accelerator and k not in _BOOKKEEPING and not k.startswith("node:")
    }
    return NodeView(
        num_gpus=int(n.resources.get(accelerator, 0)),
        resources=custom,
        labels=dict(n.labels),
        node_id=n.node_id,
        ip=n.ip,
        is_head=n.is_head,
    )


def live_view(
    nodes: list[NodeInfo],
    accelerator: str,
    cache: dict[str, tuple[NodeInfo, NodeView]] | None = None,
) -> ClusterView:
    """The alive nodes, in node-rank order, as the planner sees them. With ``cache``,
    a node's view is built again only when what Ray reports of it changed."""
    views = []
    for n in nodes:
        if not n.alive:
            continue
        hit = cache.get(n.node_id) if cache is not None else None
        if hit is not None and hit[0] == n:
            views.append(hit[1])
            continue
        view = node_view(n, accelerator)
        if cache is not None:
            cache[n.node_id] = (n, view)
        views.append(view)
    return ClusterView(nodes=order_nodes(views))


class ClusterNodes:
    """Which nodes are alive, what Ray says of each, which Ray is draining, which an
    operator cordoned, what placectl believes of each (:class:`NodeRecord`: healthy,
    silent, suspected, moved, back, fenced, dead), and the live view per accelerator:
    the nodes a plan or a spare may use (alive, not draining, not cordoned, not in
    doubt). A node an operator drained counts as draining, without a deadline, so its
    slots move as for Ray's drain.

    The one writer of all of it. Every change arrives as a fact in :attr:`inbox` and is
    applied by :meth:`settle`, in the order posted; the reads of Ray's tables
    (:meth:`refresh`, :meth:`refresh_draining`) post what they found and settle. Whoever
    needs a current view settles first; the loop takes every applied fact once
    (:meth:`take_applied`) and checks the jobs on those nodes.
    """

    def __init__(self, io: ClusterIO, flaps: Flaps | None = None) -> None:
        self._io = io
        self.flaps = flaps or Flaps(0, 1.0, 1.0)  # the nodes held down (core.flaps)
        self.inbox = Inbox()
        self._alive: set[str] = set()
        self._draining: dict[str, float] = {}  # node -> deadline (0: none)
        self._cordoned: dict[str, bool] = {}  # node -> drained too (controller.state.records)
        self._info: dict[str, NodeInfo] = {}
        self._records: dict[str, NodeRecord] = {}
        self._applied: list[Fact] = []  # applied, not yet taken by the loop
        self.dropped = 0  # facts dropped as stale or final (health, tests)
        self._version = 0  # grows whenever what the view is made of changes
        self._node_views: dict[str, dict[str, tuple[NodeInfo, NodeView]]] = {}
        self._views: dict[str, tuple[tuple[int, int], ClusterView]] = {}

    # ------------------------------------------------------------ reads
    def alive(self, node_id: str) -> bool:
        return node_id in self._alive

    def __contains__(self, node_id: object) -> bool:
        """``node_id in nodes``: the node is alive."""
        return node_id in self._alive

    def alive_ids(self) -> set[str]:
        """A copy of the alive set."""
        return set(self._alive)

    def info(self, node_id: str) -> NodeInfo | None:
        return self._info.get(node_id)

    @property
    def draining(self) -> dict[str, float]:
        """The nodes Ray is draining, as last read, and those an operator drained: node
        id -> deadline (0: none)."""
        drained = {n: 0.0 for n, drain in self._cordoned.items() if drain}
        return {**drained, **self._draining}

    def record(self, node_id: str) -> NodeRecord:
        """What placectl believes of the node (healthy when nothing was said of it)."""
        return self._records.get(node_id) or NodeRecord(node=node_id)

    def phase(self, node_id: str) -> doubts.Phase:
        got = self._records.get(node_id)
        return got.phase if got is not None else doubts.HEALTHY

    def next_phase(self, node_id: str) -> doubts.Phase:
        """The node's phase once the facts waiting for it in the inbox are applied: what
        a writer checks before it posts, so that one transition is posted once however
        long the loop takes to settle (two sweeps of the watch between two settles would
        otherwise both see it silent and both suspect it)."""
        record = self.record(node_id)
        for fact in self.inbox.waiting(node_id):
            record = doubts.step(record, fact) or record
        return record.phase

    def records(self) -> dict[str, NodeRecord]:
        """Every node placectl said something of, and what it believes of it."""
        return dict(self._records)

    def in_doubt(self) -> dict[str, NodeRecord]:
        """The nodes neither healthy nor gone: silent, suspected, moved, back."""
        return {n: r for n, r in self._records.items() if r.phase in doubts.OPEN}

    def silent(self) -> set[str]:
        """The alive nodes silent to the watch, not judged yet (placement keeps them:
        most silences are blips; a repair does not move ranks onto one)."""
        return {
            n for n, r in self._records.items() if r.phase == doubts.SILENT and n in self._alive
        }

    def suspected(self) -> set[str]:
        """The nodes whose slots are broken though Ray calls them alive: suspected or
        moved (``back`` ones answer again: their kept slots are theirs)."""
        return {
            n
            for n, r in self._records.items()
            if r.phase in (doubts.SUSPECTED, doubts.MOVED) and n in self._alive
        }

    def view(self, accelerator: str) -> ClusterView:
        """The nodes a plan may use, in node-rank order, built again only when they
        changed: alive, not draining, not cordoned, not in doubt, not held down."""
        held = self.flaps.held(core.now())
        version = (self._version, self.flaps.version)
        cached = self._views.get(accelerator)
        if cached is not None and cached[0] == version:
            return cached[1]
        cache = self._node_views.setdefault(accelerator, {})
        out = self._draining.keys() | self._cordoned.keys() | held.keys()
        out |= {n for n, r in self._records.items() if r.phase in doubts.OUT}
        usable = [
            n for n in self._info.values() if n.node_id in self._alive and n.node_id not in out
        ]
        view = live_view(usable, accelerator, cache)
        self._views[accelerator] = (version, view)
        return view

    def alive_view(self, accelerator: str) -> ClusterView:
        """Every alive node, in node-rank order, in placement or not (suspected, back,
        cordoned, draining): where a demand for new nodes must not land."""
        alive = [n for n in self._info.values() if n.node_id in self._alive]
        return live_view(alive, accelerator, self._node_views.setdefault(accelerator, {}))

    # ------------------------------------------------------------ facts
    def post(self, fact: Fact) -> None:
        """Post ``fact`` to the inbox; it is applied at the next :meth:`settle`."""
        self.inbox.post(fact)

    def say(self, node: str, kind: Kind, source: Source, **fields) -> None:
        """Post a fact of ``kind`` about ``node`` taken now."""
        self.post(Fact(node=node, kind=kind, source=source, when=core.now(), **fields))

    def settle(self) -> list[Fact]:
        """Apply every fact waiting, in order; the ones that changed something."""
        applied = [f for f in self.inbox.take() if self._apply(f)]
        self._applied.extend(applied)
        return applied

    def take_applied(self) -> list[Fact]:
        """Every fact applied since the last call (by whoever settled): the loop checks
        the jobs on their nodes."""
        applied, self._applied = self._applied, []
        return applied

    def _apply(self, fact: Fact) -> bool:
        node, kind = fact.node, fact.kind
        record = self.record(node)
        if kind == Kind.JOINED:
            if record.phase in doubts.FINAL or node in self._alive:
                self.dropped += record.phase in doubts.FINAL
                return False
            self._alive.add(node)
            self._version += 1
            return True
        if kind in (Kind.DRAINING, Kind.UNDRAINED):
            return self._drain(node, fact.deadline if kind == Kind.DRAINING else None)
        if kind in (Kind.CORDONED, Kind.UNCORDONED):
            return self._cordon(node, fact.drain if kind == Kind.CORDONED else None)
        new = doubts.step(record, fact)
        if new is None:
            self.dropped += 1
            return False
        self._records[node] = new  # a healthy one is kept too: its as_of drops older answers
        if new.phase in doubts.FINAL:
            self._gone(node)
        if (record.phase in doubts.OUT) != (new.phase in doubts.OUT):
            self._version += 1
        if new.phase != record.phase:
            log.info("node %s: %s -> %s (%s)", node[:12], record.phase, new.phase, fact.source)
        return True

    def _gone(self, node: str) -> None:
        self._alive.discard(node)
        self.flaps.drop(node)
        info = self._info.get(node)
        if info is not None and info.alive:
            self._info[node] = msgspec.structs.replace(info, alive=False)
        self._version += 1

    def _drain(self, node: str, deadline: float | None) -> bool:
        if self._draining.get(node) == deadline or (
            deadline is None and node not in self._draining
        ):
            return False
        if deadline is None:
            del self._draining[node]
        else:
            self._draining[node] = deadline
        self._version += 1
        return True

    def _cordon(self, node: str, drain: bool | None) -> bool:
        if self._cordoned.get(node) == drain or (drain is None and node not in self._cordoned):
            return False
        if drain is None:
            del self._cordoned[node]
        else:
            self._cordoned[node] = drain
        self._version += 1
        return True

    # ------------------------------------------------------------ Ray's tables, read
    async def refresh(self) -> bool:
        """Read Ray's full node list and post what it says of each node (alive or dead,
        taken when the read was sent); settle. True if a node joined since the last one."""
        known = bool(self._info)
        infos = await self._io.nodes()
        listed = {n.node_id for n in infos}
        for n in infos:
            if n.alive != (n.node_id in self._alive):
                self.say(n.node_id, Kind.JOINED if n.alive else Kind.DIED, Source.RAY_READ)
        for node in self._alive - listed:  # Ray no longer lists it: gone
            self.say(node, Kind.DIED, Source.RAY_READ)
        joined = any(f.kind == Kind.JOINED for f in self.settle())
        # What Ray said of each node, but alive as the view holds it (a node fenced while
        # the read was under way is dead, whatever the read says).
        info = {
            n.node_id: n
            if n.alive == (n.node_id in self._alive)
            else msgspec.structs.replace(n, alive=n.node_id in self._alive)
            for n in infos
        }
        if info != self._info:  # unchanged nodes keep their views (and plans made on them)
            self._info = info
            self._version += 1
        forgotten = [n for n, r in self._records.items() if n not in listed and r.phase in FINAL]
        for node in forgotten:  # Ray forgot it: nothing more can be said of it
            del self._records[node]
        return joined and known

    async def refresh_draining(self) -> None:
        """Read Ray's draining nodes and post what changed; settle."""
        sent = core.now()
        draining = await self._io.draining_nodes()
        for node in self._draining.keys() - draining.keys():
            self.post(Fact(node=node, kind=Kind.UNDRAINED, source=Source.RAY_READ, when=sent))
        for node, deadline in draining.items():
            if self._draining.get(node) != deadline:
                self.post(
                    Fact(
                        node=node,
                        kind=Kind.DRAINING,
                        source=Source.RAY_READ,
                        when=sent,
                        deadline=deadline,
                    )
                )
        self.settle()

    def owed(self, owed: Mapping[str, set[str]]) -> None:
        """At recovery: the nodes the table says slots moved off while they were away
        (node -> the reservation uids whose groups are kept there until it answers) are
        in doubt again, as before the restart: moved, out of placement, watched, and
        swept when they answer. A node Ray calls dead needs none of it. Settles."""
        for node in sorted(owed.keys() & self._alive):
            why = "its slots moved off it while it was away, before the controller restarted"
            self.say(node, Kind.SUSPECTED, Source.TABLE, detail=why)
            for uid in sorted(owed[node]):
                self.say(node, Kind.MOVED, Source.TABLE, detail=uid)
        self.settle()

    def cordons(self, cordons: Mapping[str, Cordon], source: Source) -> None:
        """Post how the operator's cordons (node -> its cordon) differ from the view's;
        settle."""
        for node in self._cordoned.keys() - cordons.keys():
            self.say(node, Kind.UNCORDONED, source)
        for node, c in cordons.items():
            if self._cordoned.get(node) != c.drain:
                self.say(node, Kind.CORDONED, source, drain=c.drain)
        self.settle()


__all__ = ["ClusterNodes", "live_view", "node_view"]
