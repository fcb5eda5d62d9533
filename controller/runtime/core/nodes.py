"""The nodes: the cluster's nodes as Ray last reported them, the planner's view of them,
and the nodes placectl asks the autoscaler for.

Kept from what the loop follows (Ray's node events, full reads at joins and full checks,
direct questions about a reservation's nodes), so that a reserve costs what its job
costs, not a read and a sort of the whole cluster.

**Demand**: what placectl shows the cluster's autoscaler, held as placement groups.

Each owner (a reserve waiting for nodes, a reservation whose lost or draining slot has no
spare) states what it wants as a :class:`~controller.state.wants.Want`; this module
holds it as placement groups Ray reports as pending demand, which an autoscaler (Ray's,
KubeRay's) reads to add nodes. Their selectors keep them off every live node that could
hold them, so one is placed only on a node that joined for it. Then it has done its
work: :meth:`Demand.settle` removes it, waits until Ray reports its resources free, and
the owner uses the node as any other. Nothing placectl holds keeps a node once the
reservation that wanted it is placed, released or cancelled.

The groups are not detached: a controller that dies takes them with it, and the one
that comes back states its demand again from what it finds. Their names start with
``placectl-demand:``, outside every controller's prefix, so no orphan sweep sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Mapping

import msgspec

from controller.planning.cluster import ClusterView, NodeView, order_nodes
from controller.runtime import core
from controller.runtime.edge import CREATED, ClusterIO, NodeInfo
from controller.state.records import Cordon
from controller.state.wants import Want

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
    operator cordoned, and the live view per accelerator: the nodes a plan or a spare
    may use (alive, not draining, not cordoned). A node an operator drained counts as
    draining, without a deadline, so its slots move as for Ray's drain.

    The one writer of the node view: Ray's lists come in through :meth:`refresh` and
    :meth:`refresh_draining` (read through ``io``, the cluster seam), node events and
    the fence's verdicts through :meth:`joined` and :meth:`died`, the operator's cordons
    through :meth:`set_cordoned`. Whoever needs a fresh view asks for one; nobody hands
    it a list."""

    def __init__(self, io: ClusterIO) -> None:
        self._io = io
        self._alive: set[str] = set()
        self._draining: dict[str, float] = {}  # node -> deadline (0: none)
        self._cordoned: dict[str, bool] = {}  # node -> drained too (controller.state.records)
        self._info: dict[str, NodeInfo] = {}
        self._version = 0  # grows whenever _info changes
        self._node_views: dict[str, dict[str, tuple[NodeInfo, NodeView]]] = {}
        self._views: dict[str, tuple[int, ClusterView]] = {}

    def alive(self, node_id: str) -> bool:
        return node_id in self._alive

    def __contains__(self, node_id: object) -> bool:
        """``node_id in nodes``: the node is alive."""
        return node_id in self._alive

    @property
    def draining(self) -> dict[str, float]:
        """The nodes Ray is draining, as last read, and those an operator drained: node
        id -> deadline (0: none)."""
        drained = {n: 0.0 for n, drain in self._cordoned.items() if drain}
        return {**drained, **self._draining}

    def set_cordoned(self, cordons: Mapping[str, Cordon]) -> None:
        """Take the operator's cordons (node -> its cordon); the view leaves them out."""
        cordoned = {n: c.drain for n, c in cordons.items()}
        if cordoned != self._cordoned:
            self._cordoned = dict(cordoned)
            self._version += 1

    async def refresh_draining(self) -> None:
        """Read Ray's draining nodes; the view leaves them out from now on."""
        draining = await self._io.draining_nodes()
        if draining != self._draining:
            self._draining = dict(draining)
            self._version += 1

    def alive_ids(self) -> set[str]:
        """A copy of the alive set."""
        return set(self._alive)

    def info(self, node_id: str) -> NodeInfo | None:
        return self._info.get(node_id)

    async def refresh(self) -> bool:
        """Read Ray's full node list; True if a node joined since the last one."""
        infos = await self._io.nodes()
        alive = {n.node_id for n in infos if n.alive}
        joined = bool(alive - self._alive) and bool(self._info)
        self._alive = alive
        info = {n.node_id: n for n in infos}
        if info != self._info:  # unchanged nodes keep their views (and plans made on them)
            self._info = info
            self._version += 1
        return joined

    def joined(self, node_id: str) -> None:
        """A node joined (its full entry comes with the next full list)."""
        self._alive.add(node_id)

    def died(self, node_id: str) -> None:
        self._alive.discard(node_id)
        info = self._info.get(node_id)
        if info is not None and info.alive:
            self._info[node_id] = msgspec.structs.replace(info, alive=False)
            self._version += 1

    def view(self, accelerator: str) -> ClusterView:
        """The alive nodes in node-rank order, built again only when they changed."""
        cached = self._views.get(accelerator)
        if cached is not None and cached[0] == self._version:
            return cached[1]
        cache = self._node_views.setdefault(accelerator, {})
        out = self._draining.keys() | self._cordoned.keys()
        usable = [n for n in self._info.values() if n.node_id not in out]
        view = live_view(usable, accelerator, cache)
        self._views[accelerator] = (self._version, view)
        return view


log = logging.getLogger("placectl.controller")
DEMAND_PREFIX = "placectl-demand:"


class Demand:
    """What each owner asks the autoscaler for, by key (``nodes/JOB``, ``spare/JOB``).

    Args:
        io: the cluster.
        nodes: the nodes as Ray last reported them, refreshed when a demand is placed.
        name: the controller's name, in the groups' names.
        grace: after a demand was placed, its owner gets this long to use the node
            before the same key asks again (else a node Ray reports free a moment late
            would be asked for twice).
        free_wait: how long :meth:`settle` waits for Ray to report a placed demand's
            resources free again once it is removed.
    """

    def __init__(
        self,
        io: ClusterIO,
        nodes: ClusterNodes,
        name: str,
        grace: float = 10.0,
        free_wait: float = 5.0,
    ) -> None:
        self._io = io
        self._nodes = nodes
        self._name = name
        self._grace = grace
        self._free_wait = free_wait
        self._wants: dict[str, Want] = {}
        self._held: dict[str, list[str]] = {}  # key -> group ids stating its want
        self._placed_at: dict[str, float] = {}  # key -> when a demand of it was placed
        self.asked = 0  # groups created, ever (metrics, tests)
        self.met = 0  # groups placed on a node that joined for them

    def wants(self) -> dict[str, Want]:
        """Every want held now, by key."""
        return {k: w for k, w in self._wants.items() if self._held.get(k)}

    def held(self, key: str) -> Want | None:
        """The want ``key`` holds as groups now, if any."""
        return self._wants.get(key) if self._held.get(key) else None

    async def want(self, key: str, want: Want | None) -> None:
        """Hold ``want`` for ``key`` (None withdraws it). The same want again changes
        nothing; another replaces the groups."""
        if want is None or not want.groups:
            await self.withdraw(key)
            return
        held = self._wants.get(key)
        if held is not None and self._held.get(key) and _same_but_avoid(held, want):
            return  # only nodes that joined since differ: the groups asked stand (one of
            # those may be the node they asked for, its resources not reported yet)
        if core.now() - self._placed_at.get(key, float("-inf")) < self._grace:
            return  # a node joined for this key a moment ago: its owner uses it first
        await self.withdraw(key)
        ids: list[str] = []
        self._wants[key], self._held[key] = want, ids
        tag = secrets.token_hex(3)
        for i, group in enumerate(want.groups):
            ids.append(
                await self._io.create_demand(f"{DEMAND_PREFIX}{self._name}:{key}:{tag}:{i}", group)
            )
        self.asked += len(ids)
        log.info("asking the autoscaler for %s (%s): %s", key, want.why, want.describe())

    async def settle(self, key: str) -> bool:
        """If a group of ``key`` was placed (a node joined for it), remove every group
        of ``key``, wait until Ray reports the node alive and the group's resources free
        there, and return True: the owner finds the node as any other and asks again
        for what is still missing."""
        ids = self._held.get(key)
        if not ids:
            return False
        table = await self._io.groups(ids)
        want = self._wants[key]
        freed: dict[str, dict[str, float]] = {}  # node -> what the placed groups held
        for gid, group in zip(ids, want.groups, strict=True):
            info = table.get(gid)
            if info is None or info.state != CREATED:
                continue
            for node, bundle in zip(info.nodes, group.bundles, strict=True):
                held = freed.setdefault(node, {})
                for k, v in bundle.items():
                    held[k] = held.get(k, 0.0) + v
        if not freed:
            return False
        self._placed_at[key] = core.now()
        self.met += 1
        await self.withdraw(key)
        await self._nodes.refresh()
        await self._wait_free(freed)
        log.info("demand %s was met on node(s) %s", key, ", ".join(n[:12] for n in sorted(freed)))
        return True

    async def _wait_free(self, freed: dict[str, dict[str, float]]) -> None:
        """Until Ray reports each node's ``freed`` resources available (it does so a
        moment after a removal), at most ``free_wait``."""
        deadline = core.now() + self._free_wait
        while core.now() < deadline:
            free = await self._io.free_resources()
            if all(
                free.get(node, {}).get(k, 0.0) + 1e-9 >= v
                for node, held in freed.items()
                for k, v in held.items()
            ):
                return
            await asyncio.sleep(0.1)

    async def placed(self) -> list[str]:
        """The keys with a group placed now (a node joined for them): their owners can
        act at once instead of at their next retry. One read of the held groups."""
        ids = {gid: key for key, held in self._held.items() for gid in held}
        if not ids:
            return []
        table = await self._io.groups(sorted(ids))
        return sorted({ids[g] for g, info in table.items() if info.state == CREATED})

    async def withdraw(self, key: str) -> None:
        """Remove ``key``'s groups; it asks for nothing any more."""
        ids = self._held.pop(key, [])
        self._wants.pop(key, None)
        for gid in ids:
            with contextlib.suppress(Exception):  # gone with the controller's last run
                await self._io.remove_group(gid)

    async def withdraw_job(self, job: str) -> None:
        """Withdraw every want of ``job``."""
        for key in [k for k in self._wants if k.split("/", 1)[-1] == job]:
            await self.withdraw(key)

    async def keep_only(self, jobs: set[str]) -> None:
        """Withdraw the wants of jobs not in ``jobs`` (the loop's safety net)."""
        for key in [k for k in self._wants if k.split("/", 1)[-1] not in jobs]:
            await self.withdraw(key)


def _same_but_avoid(a: Want, b: Want) -> bool:
    """Whether two wants ask for the same groups, whatever nodes each avoids."""
    if len(a.groups) != len(b.groups):
        return False
    return all(
        (x.bundles, x.strategy, x.labels) == (y.bundles, y.strategy, y.labels)
        for x, y in zip(a.groups, b.groups, strict=True)
    )
