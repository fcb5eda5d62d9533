"""The real :class:`~controller.runtime.io.ClusterIO`: Ray's GCS, placement groups and tasks.

Imported only inside the cluster (the controller actor) and by drivers that schedule into
bundles (:func:`group_handle`); ``import controller`` never imports it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging

import ray
from ray._raylet import NodeID, PlacementGroupID
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table

from controller.runtime import probe as tasks
from controller.runtime.io import HEAD_RESOURCE, DeviceInfo, GroupInfo, NodeEvent, NodeInfo
from controller.runtime.metrics import RayMetrics

log = logging.getLogger("placectl.controller")
GCS_TIMEOUT_S = 10.0


@functools.lru_cache(maxsize=4096)
def group_handle(group_id: str) -> PlacementGroup:
    """A handle to a placement group from its hex id (names are namespace-scoped; ids
    are not). Handles are cached: each one caches its bundles after the first lookup,
    which saves a GCS round trip for every actor scheduled into the group."""
    return PlacementGroup(PlacementGroupID(bytes.fromhex(group_id)))


def node_infos() -> list[NodeInfo]:
    """Every node Ray knows, alive or dead (a blocking GCS read)."""
    out = []
    for n in ray.nodes():
        res = n.get("Resources") or {}
        out.append(
            NodeInfo(
                node_id=n["NodeID"],
                ip=n.get("NodeManagerAddress", ""),
                alive=bool(n.get("Alive")),
                is_head=HEAD_RESOURCE in res,
                resources={str(k): float(v) for k, v in res.items()},
                labels={str(k): str(v) for k, v in (n.get("Labels") or {}).items()},
            )
        )
    return out


def _group_info(gid: str, entry: dict) -> GroupInfo:
    nodes = entry.get("bundles_to_node_id") or {}
    return GroupInfo(
        group_id=gid,
        name=entry.get("name") or "",
        state=entry.get("state", "PENDING"),
        nodes=[nodes[i] for i in sorted(nodes)],
    )


class RayClusterIO:
    """Ray behind the controller's cluster-I/O interface.

    Args:
        namespace: the GCS key-value namespace of the controller's table (no colon).
        key_prefix: what every key of the table starts with.
    """

    def __init__(self, namespace: str, key_prefix: bytes = b"") -> None:
        self._ns = namespace.encode()
        self._kp = key_prefix
        self.metrics = RayMetrics()
        self._events: collections.deque[NodeEvent] = collections.deque()
        self._arrived: asyncio.Event | None = None  # set while events wait to be drained
        self._watch: asyncio.Task | None = None
        self._alive: set[str] | None = None  # last alive set, when polling
        self._polling = False

    # ------------------------------------------------------------ key-value store
    @staticmethod
    def _gcs():
        return ray._private.worker.global_worker.gcs_client

    async def kv_get(self, key: bytes) -> bytes | None:
        return await self._gcs().async_internal_kv_get(
            self._kp + key, self._ns, timeout=GCS_TIMEOUT_S
        )

    async def kv_multi_get(self, keys: list[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        got = await self._gcs().async_internal_kv_multi_get(
            [self._kp + k for k in keys], self._ns, timeout=GCS_TIMEOUT_S
        )
        return {k[len(self._kp) :]: v for k, v in got.items()}

    async def kv_put(self, key: bytes, value: bytes) -> None:
        await self._gcs().async_internal_kv_put(
            self._kp + key, value, True, self._ns, timeout=GCS_TIMEOUT_S
        )

    async def kv_delete(self, key: bytes) -> None:
        await self._gcs().async_internal_kv_del(
            self._kp + key, False, self._ns, timeout=GCS_TIMEOUT_S
        )

    async def kv_keys(self, prefix: bytes) -> list[bytes]:
        keys = await self._gcs().async_internal_kv_keys(
            self._kp + prefix, self._ns, timeout=GCS_TIMEOUT_S
        )
        return [k[len(self._kp) :] for k in keys]

    # ------------------------------------------------------------ nodes
    async def nodes(self) -> list[NodeInfo]:
        return await asyncio.to_thread(node_infos)

    async def free_resources(self) -> dict[str, dict[str, float]]:
        return await asyncio.to_thread(ray._private.state.available_resources_per_node)

    async def node_events(self) -> list[NodeEvent]:
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._subscribe())
        if self._polling:
            await self._poll_nodes()
        out = list(self._events)
        self._events.clear()
        if self._arrived is not None:
            self._arrived.clear()
        return out

    async def wait_for_events(self, timeout: float) -> None:
        if self._arrived is None:
            self._arrived = asyncio.Event()
        if self._events or self._polling:  # polling learns of events only when asked
            if self._polling:
                await asyncio.sleep(timeout)
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), timeout)

    async def dead_nodes(self, node_ids: list[str]) -> set[str]:
        if not node_ids:
            return set()
        ids = sorted(set(node_ids))
        alive = await self._gcs().async_check_alive(
            [NodeID.from_hex(n) for n in ids], GCS_TIMEOUT_S
        )
        return {n for n, up in zip(ids, alive, strict=True) if not up}

    async def _subscribe(self) -> None:
        """Follow Ray's node-info channel (pushed by the GCS); on any failure fall back
        to comparing alive sets on every call."""
        try:
            from ray._private.gcs_pubsub import GcsAioNodeInfoSubscriber

            address = ray.get_runtime_context().gcs_address
            sub = GcsAioNodeInfoSubscriber(address=address)
            await sub.subscribe()
            while True:
                for node_id, info in await sub.poll(batch_size=1000):
                    alive = info.state == 0  # GcsNodeInfo.ALIVE
                    self._events.append(NodeEvent(bytes(node_id).hex(), alive))
                    if self._arrived is not None:
                        self._arrived.set()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("node-info subscription unavailable (%s); polling node states", e)
            self._polling = True

    async def _poll_nodes(self) -> None:
        alive = {n.node_id for n in await self.nodes() if n.alive}
        if self._alive is not None:
            self._events.extend(NodeEvent(n, False) for n in sorted(self._alive - alive))
            self._events.extend(NodeEvent(n, True) for n in sorted(alive - self._alive))
        self._alive = alive

    # ------------------------------------------------------------ placement groups
    async def create_group(self, name: str, bundles: list[dict[str, float]], node_id: str) -> str:
        def make() -> str:
            pg = placement_group(
                bundles,
                strategy="PACK",
                name=name,
                lifetime="detached",
                bundle_label_selector=[{"ray.io/node-id": node_id}] * len(bundles),
            )
            return pg.id.hex()

        return await asyncio.to_thread(make)

    async def wait_group(self, group_id: str, timeout: float) -> bool:
        try:
            await asyncio.wait_for(_result(group_handle(group_id).ready()), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def remove_group(self, group_id: str) -> None:
        await asyncio.to_thread(ray.util.remove_placement_group, group_handle(group_id))

    async def groups(self, ids: list[str] | None = None) -> dict[str, GroupInfo]:
        def read() -> dict[str, GroupInfo]:
            if ids is None or len(ids) > 16:
                table = placement_group_table()
                wanted = table if ids is None else {i: table[i] for i in ids if i in table}
                return {gid: _group_info(gid, e) for gid, e in wanted.items()}
            out = {}
            for gid in ids:
                entry = placement_group_table(group_handle(gid))
                if entry:
                    out[gid] = _group_info(gid, entry)
            return out

        return await asyncio.to_thread(read)

    # ------------------------------------------------------------ tasks in the cluster
    async def probe(self, group_id: str, bundle_index: int, accelerator: str) -> DeviceInfo:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        request = (
            {"num_gpus": PROBE_SHARE}
            if accelerator == "GPU"
            else {"resources": {accelerator: PROBE_SHARE}}
        )
        ref = tasks.probe.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group_handle(group_id), placement_group_bundle_index=bundle_index
            ),
            **request,
        ).remote(accelerator)
        return DeviceInfo(**(await _result(ref)))

    async def free_ports(self, node_id: str, candidates: list[int]) -> list[int]:
        ref = tasks.free_ports.options(scheduling_strategy=_on(node_id)).remote(candidates)
        return await _result(ref)

    def warm(self, node_id: str) -> None:
        tasks.warm.options(scheduling_strategy=_on(node_id)).remote()

    def own_node(self) -> str:
        return ray.get_runtime_context().get_node_id()


PROBE_SHARE = 0.0001  # a sliver of the accelerator, so Ray shows the probe its device


async def _result(ref: ray.ObjectRef):
    """Await an ObjectRef so that cancelling the waiter never cancels Ray's own future
    (Ray then fails an internal assertion as it sets the result)."""
    return await asyncio.shield(asyncio.wrap_future(ref.future()))


def _on(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)
