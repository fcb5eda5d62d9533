"""The Ray edge: the controller's one narrow interface to the cluster (Ray), the records
that cross it, and the metrics interface it reports to.

Every Ray call the controller makes goes through a :class:`ClusterIO`. Two
implementations stand behind it: :class:`controller.runtime.edge.ray_io.RayClusterIO` (the
real cluster) and :class:`clients.testing.fake_cluster.FakeCluster` (in memory, for unit
tests that run in milliseconds and for control-plane benchmarks at thousands of nodes),
as Ray Serve isolates its controller's actor calls for the same reason.

All methods are coroutines: the real implementation awaits Ray futures or runs blocking
GCS reads off the event loop, so the controller's lookups never queue behind them.

What it reports, and how (:class:`Metrics` implemented): :mod:`controller.runtime.edge.metrics`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import msgspec

if TYPE_CHECKING:  # imported for annotations only: every node's probe imports this package
    from controller.state.events import Event
    from controller.state.queueing import QueueUsage
    from controller.state.wants import DemandGroup

CREATED, PENDING, REMOVED, RESCHEDULING = "CREATED", "PENDING", "REMOVED", "RESCHEDULING"
# The resource Ray gives the head node only; the controller asks for a sliver of it.
HEAD_RESOURCE = "node:__internal_head__"


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One node as Ray reports it (``ray.nodes()``), alive or dead."""

    node_id: str
    ip: str = ""
    alive: bool = True
    is_head: bool = False
    resources: dict[str, float] = {}
    labels: dict[str, str] = {}
    raylet: str = ""  # host:port of the node's raylet, which answers health checks
    # host:port of another port of the raylet's process (its object manager): a second
    # path to the same process, for a refusal to be proof where no witness can look
    second: str = ""


class GroupInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One placement group as Ray's group table reports it."""

    group_id: str
    name: str = ""
    state: str = PENDING
    nodes: list[str] = []  # node id of each bundle ("" while being rescheduled)


class DeviceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a probe inside a bundle saw: the accelerator ids Ray gave it, and where the
    hardware tells it (NVIDIA), each device's UUID and PCI bus id."""

    ids: list[int]
    uuids: list[str] = []
    pci_bus_ids: list[str] = []


class NodeEvent(msgspec.Struct, frozen=True):
    """A node that joined (``alive``) or died."""

    node_id: str
    alive: bool


class Metrics(Protocol):
    """Where the controller's metrics go (:mod:`controller.runtime.edge` for Ray)."""

    def observe(self, states: dict[str, int]) -> None: ...
    def reserve_latency(self, seconds: float) -> None: ...
    def event(self, event: Event) -> None: ...
    def queues(self, usage: list[QueueUsage]) -> None: ...
    def fence(self, outcome: str) -> None: ...
    def table_readable(self, readable: bool) -> None: ...


class ClusterIO(Protocol):
    """What the controller needs from the cluster. Errors surface as exceptions."""

    metrics: Metrics

    # The GCS key-value store, in the controller's own namespace.
    async def kv_get(self, key: bytes) -> bytes | None: ...
    async def kv_multi_get(self, keys: list[bytes]) -> dict[bytes, bytes]: ...
    async def kv_put(self, key: bytes, value: bytes) -> None: ...
    async def kv_delete(self, key: bytes) -> None: ...
    async def kv_keys(self, prefix: bytes) -> list[bytes]: ...

    # Nodes.
    async def nodes(self) -> list[NodeInfo]: ...
    async def free_resources(self) -> dict[str, dict[str, float]]: ...
    async def node_events(self) -> list[NodeEvent]:
        """Nodes that joined or died since the last call, in order (drained)."""
        ...

    async def wait_for_events(self, timeout: float) -> None:
        """Return as soon as a node event is waiting to be drained, or after ``timeout``."""
        ...

    async def dead_nodes(self, node_ids: list[str]) -> set[str]:
        """Those of ``node_ids`` that Ray reports dead, or does not know, right now: one
        round trip to the GCS, whatever the cluster's size (only these nodes are asked)."""
        ...

    async def draining_nodes(self) -> dict[str, float]:
        """The nodes Ray is draining (a spot notice, a pod deleted, an idle node given
        back): node id -> the drain's deadline in wall-clock seconds (0: none given)."""
        ...

    async def node_answers(
        self,
        addresses: dict[str, str],
        timeout: float,
        why: dict[str, str] | None = None,
        ways: dict[str, int] | None = None,
    ) -> dict[str, str]:
        """Whether each node's raylet (``node id -> host:port``) answers a health check:
        ``ok``, ``refused``, ``silent`` or ``denied`` (:mod:`controller.runtime.edge.answers`);
        ``why`` gets the reason of each ``denied``; ``ways`` asks some nodes over that
        many connections at once."""
        ...

    def keep_witnesses(self, node_ids: list[str], away: set[str] = frozenset()) -> None:
        """Keep a witness standing on each of ``node_ids``, ready to answer
        :meth:`witness_answers` at once, and on no other node but those ``away`` (nodes in
        doubt): one there is left as it is, neither made nor killed, since killing or
        starting an actor on a node that is away has Ray's GCS send its raylet a request
        that cannot arrive."""
        ...

    async def witness_answers(
        self, witness: str, addresses: dict[str, str], timeout: float, ways: int = 1
    ) -> dict[str, str] | None:
        """Have node ``witness`` ask the raylets at ``addresses`` (``node id ->
        host:port``) itself, each over ``ways`` connections, as :meth:`node_answers`
        does here; ``None`` when its reply
        does not come back in time (:mod:`controller.runtime.core.evidence`)."""
        ...

    async def fence(self, node_id: str, why: str) -> None:
        """Have Ray mark ``node_id`` dead now, with ``why`` as the reason it shows.
        Raises :class:`~controller.runtime.edge.answers.CallDenied` when Ray refuses
        placectl itself (its token, its TLS credentials)."""
        ...

    # Placement groups.
    async def create_group(self, name: str, bundles: list[dict[str, float]], node_id: str) -> str:
        """Create a detached group whose bundles are pinned to ``node_id``; its hex id.
        Returns at once; :meth:`wait_group` waits for it to be placed."""
        ...

    async def create_demand(self, name: str, group: DemandGroup) -> str:
        """Create a group that states demand (:mod:`controller.runtime.core.nodes`): not
        detached, placed where its strategy and selector allow; its hex id."""
        ...

    async def wait_group(self, group_id: str, timeout: float) -> bool: ...
    async def remove_group(self, group_id: str) -> None: ...
    async def groups(self, ids: list[str] | None = None) -> dict[str, GroupInfo]:
        """Group table entries of ``ids`` (absent ids are missing), or of every group."""
        ...

    # Work inside the cluster.
    async def probe(self, group_id: str, bundle_index: int, accelerator: str) -> DeviceInfo: ...
    async def free_ports(self, node_id: str, candidates: list[int]) -> list[int]:
        """The ports of ``candidates`` that nothing on the node has bound and that lie
        outside the node's ephemeral port range, in the given order."""
        ...

    async def end_leftovers(self, node_id: str, uid: str, ray_workers: bool = False) -> list[str]:
        """End every process on the node that a worker of reservation ``uid`` left there
        (:mod:`controller.runtime.edge.node_tasks`), and with ``ray_workers`` its Ray
        workers too (ranks moved off a node that was away: Ray ends them only once its GCS
        reaches the node again); their command lines. Never returns from a node that does
        not answer: the caller bounds the wait."""
        ...

    def detection_bound(self) -> float:
        """How long Ray takes, at least, to declare a silent node dead, from the cluster's
        health-check settings: each failed check waits its timeout, the next comes a
        period later, and the node is dead after the threshold's count of failures."""
        ...

    def warm(self, node_id: str) -> None:
        """Start (or touch) an idle worker on a node, so a probe there starts at once."""
        ...

    def own_node(self) -> str:
        """The node the controller itself runs on."""
        ...

    def watching(self) -> str:
        """How node events arrive: ``subscribed``, ``reconnecting`` (the GCS is away)
        or ``polling``."""
        ...

    def ray_version(self) -> str:
        """The Ray release the cluster runs (what it can do: :mod:`controller.ray_versions`)."""
        ...

    def gcs_store(self) -> str:
        """Where the GCS keeps its tables: ``redis`` or ``rocksdb`` (they survive a head
        restart), or ``memory`` (a lost head loses every reservation)."""
        ...
