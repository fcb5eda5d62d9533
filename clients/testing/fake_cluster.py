"""An in-memory cluster behind the controller's :class:`ClusterIO` interface.

It behaves as Ray does where placectl depends on it: groups pinned to a node are placed
when that node has room and stay pending otherwise; a group on a dead node is
rescheduling for ever (its pin cannot move); a removed group is REMOVED and frees its
resources; each accelerator bundle gets a physical device id of its node. Faults can be
injected (failing or hanging key-value writes, groups that are slow to go, nodes that do
not answer), and Ray's own latencies are modelled, not slept, so a benchmark can tell
placectl's cost from Ray's: :attr:`FakeCluster.ray_seconds` is what Ray would have
spent.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools

import msgspec

from clients.testing.fake_network import FakeNetwork
from clients.testing.fake_placement import FakeFault, FakeGroup, FakeNode, place, usable
from clients.testing.fake_store import FakeStore
from controller.ray_versions import PIN_BY_LABEL, has
from controller.runtime.edge import (
    CREATED,
    HEAD_RESOURCE,
    PENDING,
    REMOVED,
    RESCHEDULING,
    DeviceInfo,
    GroupInfo,
    NodeEvent,
    NodeInfo,
)
from controller.runtime.edge.metrics import KeptMetrics


class Latency:
    """Ray's costs, in seconds, as the fake models them (all zero by default)."""

    def __init__(
        self,
        gcs_rtt: float = 0.0,
        group_create: float = 0.0,
        group_place: float = 0.0,
        probe: float = 0.0,
        per_node_read: float = 0.0,
        notice: float = 0.0,
        witness_start: float = 0.0,
    ):
        self.gcs_rtt = gcs_rtt  # one key-value or table round trip
        self.group_create = group_create  # the GCS schedules groups one at a time
        self.group_place = group_place  # from created to ready
        self.probe = probe  # one probe task in a bundle
        self.per_node_read = per_node_read  # added per node to a whole-cluster read
        self.notice = notice  # from a node's death to Ray's event of it (scenarios wait it)
        self.witness_start = witness_start  # a witness actor's process started on a node


class FakeCluster(FakeNetwork, FakeStore):
    """An in-memory Ray cluster. Nodes are added with :meth:`add_node`.

    Args:
        accelerator: the accelerator resource name (``GPU``).
        latency: Ray's modelled costs; summed into :attr:`ray_seconds`.
        sleeps: also spend them, the way Ray does: group creations one at a time (the
            GCS schedules them in turn), then each placed; probes one at a time per node
            (one warm worker answers them). Otherwise nothing waits.
    """

    def __init__(
        self, accelerator: str = "GPU", latency: Latency | None = None, sleeps: bool = False
    ) -> None:
        self.accelerator = accelerator
        self.latency = latency or Latency()
        self.sleeps = sleeps
        self._gcs = asyncio.Lock()
        self._probing: dict[str, asyncio.Lock] = {}
        self.metrics = KeptMetrics()
        self.nodes_by_id: dict[str, FakeNode] = {}
        self.groups_by_id: dict[str, FakeGroup] = {}
        self.events: collections.deque[NodeEvent] = collections.deque()
        self.ray_seconds = 0.0
        self.calls: collections.Counter[str] = collections.Counter()
        self.warmed: collections.Counter[str] = collections.Counter()
        self.slow_removal: set[str] = set()  # group ids whose removal Ray never reports
        self.create_delay = 0.0  # seconds a creation takes; it completes even if the
        # caller stops waiting, as Ray's does
        self.probe_delay = 0.0  # seconds a probe task takes
        self.store = "redis"  # where the GCS keeps its tables (gcs_store)
        self.release = "2.60.0"  # the Ray release it claims to run (ray_version)
        self.ray_detection = 62.0  # Ray's detection of a silent node (its defaults)
        self.fenced: dict[str, str] = {}  # node -> the reason placectl gave Ray
        self.fence_refusal: Exception | None = None  # raised by every fence while set
        FakeNetwork.__init__(self)
        FakeStore.__init__(self)
        self.draining: dict[str, float] = {}  # node -> deadline (0: none); nothing new lands
        self._ids = itertools.count(1)
        self._making: set[asyncio.Task] = set()
        self._pending: set[str] = set()  # groups waiting for room, the only ones to retry
        self._on_node: dict[str, set[str]] = collections.defaultdict(set)
        self._waiting: list[asyncio.Future] = []  # wait_for_events callers

    def _event(self, event: NodeEvent) -> None:
        self.events.append(event)
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_result(None)
        self._waiting.clear()

    # ------------------------------------------------------------ building the cluster
    def add_node(
        self,
        num_gpus: int = 0,
        num_cpus: float = 8,
        resources: dict[str, float] | None = None,
        labels: dict[str, str] | None = None,
        ip: str | None = None,
        head: bool = False,
        device_ids: list[int] | None = None,
    ) -> str:
        """Add an alive node; returns its id. ``device_ids`` are the physical ids of
        its accelerators in Ray's slot order (default 0..n-1)."""
        n = next(self._ids)
        node_id = f"{n:056x}"
        res = {"CPU": float(num_cpus), **(resources or {})}
        if num_gpus:
            res[self.accelerator] = float(num_gpus)
        if head:
            res[HEAD_RESOURCE] = 1.0
        info = NodeInfo(
            node_id=node_id,
            ip=ip or f"10.0.{n // 250}.{n % 250 + 1}",
            is_head=head,
            resources=res,
            labels={"ray.io/node-id": node_id, **(labels or {})},
            raylet=f"{ip or f'10.0.{n // 250}.{n % 250 + 1}'}:{40000 + n}",
            second=f"{ip or f'10.0.{n // 250}.{n % 250 + 1}'}:{50000 + n}",
        )
        devices = device_ids if device_ids is not None else list(range(num_gpus))
        self.nodes_by_id[node_id] = FakeNode(info, self.accelerator, devices)
        self._event(NodeEvent(node_id, True))
        self._schedule()
        return node_id

    def kill_node(self, node_id: str) -> None:
        """The node dies: its groups go to RESCHEDULING (pinned, they cannot move; on a Ray
        that only hints where a group goes, 2.48, Ray places them again elsewhere)."""
        node = self.nodes_by_id[node_id]
        node.info = msgspec.structs.replace(node.info, alive=False)
        for gid in self._on_node[node_id]:
            g = self.groups_by_id[gid]
            if g.state == CREATED:
                g.state = PENDING if g.soft else RESCHEDULING
                g.ready.clear()
                if g.soft:
                    self._pending.add(gid)
        self._schedule()
        self._event(NodeEvent(node_id, False))

    def crash_node(self, node_id: str, how: str = "refused") -> None:
        """The node's processes die at once (``refused``), stop (``silent``, a hang) or go
        on again (``ok``), or its raylet refuses placectl's credentials (``denied``); Ray
        calls it alive all along, until it is fenced."""
        node = self.nodes_by_id[node_id]
        node.raylet, node.answers = how, how == "ok"

    def remove_group_behind_back(self, group_id: str) -> None:
        """Someone else removed a group of ours."""
        self._remove(self.groups_by_id[group_id])

    def alive(self) -> list[str]:
        return [i for i, n in self.nodes_by_id.items() if n.info.alive]

    # ------------------------------------------------------------ key-value store
    def _cost(self, what: str, seconds: float) -> None:
        self.calls[what] += 1
        self.ray_seconds += seconds

    # ------------------------------------------------------------ nodes
    async def nodes(self) -> list[NodeInfo]:
        self._cost(
            "nodes", self.latency.gcs_rtt + self.latency.per_node_read * len(self.nodes_by_id)
        )
        return [n.info for n in self.nodes_by_id.values()]

    async def free_resources(self) -> dict[str, dict[str, float]]:
        self._cost(
            "free", self.latency.gcs_rtt + self.latency.per_node_read * len(self.nodes_by_id)
        )
        return {i: n.free for i, n in self.nodes_by_id.items() if n.info.alive}

    async def node_events(self) -> list[NodeEvent]:
        out = list(self.events)
        self.events.clear()
        return out

    async def wait_for_events(self, timeout: float) -> None:
        if self.events:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(waiter, timeout)

    async def dead_nodes(self, node_ids: list[str]) -> set[str]:
        self._cost("dead_nodes", self.latency.gcs_rtt)
        return {
            n for n in node_ids if n not in self.nodes_by_id or not self.nodes_by_id[n].info.alive
        }

    async def draining_nodes(self) -> dict[str, float]:
        self._cost("draining_nodes", self.latency.gcs_rtt)
        return {n: d for n, d in self.draining.items() if self.nodes_by_id[n].info.alive}

    async def node_answers(
        self,
        addresses: dict[str, str],
        timeout: float,
        why: dict[str, str] | None = None,
        ways: dict[str, int] | None = None,
    ) -> dict[str, str]:
        self._cost("node_answers", self.latency.gcs_rtt)
        got = self._seen_from(self.own_node(), addresses, ways or 1)
        if why is not None:
            why.update({n: "UNAUTHENTICATED: injected" for n, a in got.items() if a == "denied"})
        return got

    async def fence(self, node_id: str, why: str) -> None:
        self._cost("fence", self.latency.gcs_rtt)
        if self.fence_refusal is not None:
            raise self.fence_refusal
        self.fenced[node_id] = why
        if node_id in self.nodes_by_id and self.nodes_by_id[node_id].info.alive:
            self.kill_node(node_id)

    # ------------------------------------------------------------ groups
    async def create_group(self, name: str, bundles: list[dict[str, float]], node_id: str) -> str:
        self._cost("create_group", self.latency.group_create)

        async def make() -> str:
            if self.create_delay:
                await asyncio.sleep(self.create_delay)
            if self.sleeps:  # the GCS schedules groups one at a time, then places each
                async with self._gcs:
                    await asyncio.sleep(self.latency.group_create)
                await asyncio.sleep(self.latency.group_place)
            gid = f"{next(self._ids):036x}"
            self.groups_by_id[gid] = FakeGroup(gid, name, [dict(b) for b in bundles], node_id)
            self.groups_by_id[gid].soft = not has(PIN_BY_LABEL, self.release)
            self._on_node[node_id].add(gid)
            self._pending.add(gid)
            self._schedule()
            return gid

        task = asyncio.ensure_future(make())
        self._making.add(task)
        task.add_done_callback(self._making.discard)
        return await asyncio.shield(task)

    async def create_demand(self, name: str, group) -> str:
        self._cost("create_group", self.latency.group_create)
        gid = f"{next(self._ids):036x}"
        self.groups_by_id[gid] = FakeGroup(gid, name, [dict(b) for b in group.bundles], "", group)
        self._pending.add(gid)
        self._schedule()
        return gid

    def pending_demand(self) -> list:
        """The demand groups waiting for a node, as an autoscaler reads them."""
        return [
            g.demand
            for g in self.groups_by_id.values()
            if g.demand is not None and g.state == PENDING
        ]

    def _schedule(self) -> None:
        for gid in sorted(self._pending):
            g = self.groups_by_id[gid]
            if g.state != PENDING:
                self._pending.discard(gid)
                continue
            nodes = [n for n in self.nodes_by_id.values() if usable(n, g, self.draining)]
            where = place(g, nodes)
            if where is None:
                continue
            g.on = where
            for i, b in enumerate(g.bundles):
                node = self.nodes_by_id[where[i]]
                self._on_node[where[i]].add(gid)
                for k, v in b.items():
                    node.free[k] = node.free.get(k, 0.0) - v
                if b.get(self.accelerator):
                    device = next(d for d in node.devices if d not in node.used_devices)
                    node.used_devices.add(device)
                    g.devices[i] = device
            g.state = CREATED
            g.ready.set()
            self._pending.discard(gid)

    async def wait_group(self, group_id: str, timeout: float) -> bool:
        self._cost("wait_group", self.latency.group_place)
        g = self.groups_by_id[group_id]
        try:
            await asyncio.wait_for(g.ready.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return g.state == CREATED

    def _remove(self, g: FakeGroup) -> None:
        for i, b in enumerate(g.bundles):
            node = self.nodes_by_id.get(g.on[i])
            if g.state != CREATED or node is None:
                continue
            for k, v in b.items():
                node.free[k] = node.free.get(k, 0.0) + v
            if g.devices[i] is not None:
                node.used_devices.discard(g.devices[i])
        g.state = REMOVED
        g.ready.set()
        self._pending.discard(g.gid)
        self._schedule()

    async def remove_group(self, group_id: str) -> None:
        self._cost("remove_group", self.latency.gcs_rtt)
        g = self.groups_by_id.get(group_id)
        if g is None or group_id in self.slow_removal:
            return
        self._remove(g)

    async def groups(self, ids: list[str] | None = None) -> dict[str, GroupInfo]:
        wanted = list(self.groups_by_id) if ids is None else ids
        asked = 1 if ids is None or len(ids) > 16 else len(ids)
        self._cost("groups", self.latency.gcs_rtt * asked)
        out = {}
        for gid in wanted:
            if (g := self.groups_by_id.get(gid)) is not None:
                placed = g.state == CREATED
                out[gid] = GroupInfo(
                    group_id=gid,
                    name=g.name,
                    state=g.state,
                    nodes=[n if placed else "" for n in g.on],
                )
        return out

    # ------------------------------------------------------------ tasks
    async def probe(self, group_id: str, bundle_index: int, accelerator: str) -> DeviceInfo:
        self._cost("probe", self.latency.probe)
        if self.probe_delay:
            await asyncio.sleep(self.probe_delay)
        g = self.groups_by_id[group_id]
        if self.sleeps:  # one warm worker a node answers its probes, one at a time
            async with self._probing.setdefault(g.node_id, asyncio.Lock()):
                await asyncio.sleep(self.latency.probe)
        if g.state != CREATED:
            raise FakeFault(f"probe in group {group_id} that is {g.state}")
        device = g.devices[bundle_index]
        return DeviceInfo(ids=[] if device is None else [device])

    async def _task_on(self, node_id: str, what: str) -> FakeNode:
        self._cost(what, self.latency.gcs_rtt)
        node = self.nodes_by_id[node_id]
        if not node.answers or not node.info.alive or not self.reaches(self.own_node(), node_id):
            await asyncio.Event().wait()  # a task on an unresponsive node never returns
        return node

    async def free_ports(self, node_id: str, candidates: list[int]) -> list[int]:
        return (await self._task_on(node_id, "free_ports")).unbound(candidates)

    async def end_leftovers(self, node_id: str, uid: str, ray_workers: bool = False) -> list[str]:
        return (await self._task_on(node_id, "end_leftovers")).end_left(uid, ray_workers)

    def detection_bound(self) -> float:
        return self.ray_detection

    def warm(self, node_id: str) -> None:
        self.warmed[node_id] += 1

    def own_node(self) -> str:
        return next((i for i, n in self.nodes_by_id.items() if n.info.is_head), "")

    def watching(self) -> str:
        return "subscribed"

    def gcs_store(self) -> str:
        return self.store

    def ray_version(self) -> str:
        return self.release
