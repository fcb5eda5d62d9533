"""The real :class:`~controller.runtime.edge.ClusterIO`: Ray's GCS, placement groups and tasks.

Imported only inside the cluster (the controller actor) and by drivers that read the
nodes (:func:`node_infos`); ``import controller`` never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import ray
from ray._raylet import NodeID
from ray.util.placement_group import placement_group, placement_group_table

from controller.ray_versions import PIN_BY_LABEL, has, installed
from controller.runtime import edge
from controller.runtime.edge import answers, node_tasks, ray_gcs
from controller.runtime.edge.metrics import RayMetrics
from controller.runtime.edge.node_events import NodeEvents
from controller.runtime.edge.ray_gcs import fence_node, gcs_store, gcs_unavailable
from controller.state.scheduling import group_handle
from controller.state.wants import DemandGroup

log = logging.getLogger("placectl.controller")


def node_infos() -> list[edge.NodeInfo]:
    """Every node Ray knows, alive or dead (a blocking GCS read)."""
    out = []
    for n in ray.nodes():
        res = n.get("Resources") or {}
        out.append(
            edge.NodeInfo(
                node_id=n["NodeID"],
                ip=n.get("NodeManagerAddress", ""),
                alive=bool(n.get("Alive")),
                is_head=edge.HEAD_RESOURCE in res,
                resources={str(k): float(v) for k, v in res.items()},
                labels={str(k): str(v) for k, v in (n.get("Labels") or {}).items()},
                raylet=f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}"
                if n.get("NodeManagerAddress") and n.get("NodeManagerPort")
                else "",
                second=f"{n['NodeManagerAddress']}:{n['ObjectManagerPort']}"
                if n.get("NodeManagerAddress") and n.get("ObjectManagerPort")
                else "",
            )
        )
    return out


def detection_bound(config) -> float:
    """Ray's own detection of a silent node with the health-check settings ``config``
    (``ray._config``, the cluster's, as every Ray process holds them): seconds."""
    threshold = max(int(config.health_check_failure_threshold()), 1)
    timeout = config.health_check_timeout_ms() / 1000.0
    period = config.health_check_period_ms() / 1000.0
    return threshold * timeout + (threshold - 1) * period


def _group_info(gid: str, entry: dict) -> edge.GroupInfo:
    nodes = entry.get("bundles_to_node_id") or {}
    return edge.GroupInfo(
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
        self._node_events = NodeEvents(self.nodes)
        self._witnesses: dict[str, ray.actor.ActorHandle] = {}  # node -> kept witness
        self._soft_pins: dict[str, str] = {}  # group -> its node, where Ray only hints

    # ------------------------------------------------------------ key-value store
    @staticmethod
    def _gcs():
        return ray._private.worker.global_worker.gcs_client

    async def _gcs_call(self, what: str, call):
        """``call(timeout)`` against the GCS, waited out while the head restarts."""
        return await ray_gcs.aretry(call, what, _log_wait, gcs_unavailable)

    async def kv_get(self, key: bytes) -> bytes | None:
        return await self._gcs_call(
            "reading the table",
            lambda t: self._gcs().async_internal_kv_get(self._kp + key, self._ns, timeout=t),
        )

    async def kv_multi_get(self, keys: list[bytes]) -> dict[bytes, bytes]:
        if not keys:
            return {}
        full = [self._kp + k for k in keys]
        got = await self._gcs_call(
            "reading the table",
            lambda t: self._gcs().async_internal_kv_multi_get(full, self._ns, timeout=t),
        )
        return {k[len(self._kp) :]: v for k, v in got.items()}

    async def kv_put(self, key: bytes, value: bytes) -> None:
        await self._gcs_call(
            "writing the table",
            lambda t: self._gcs().async_internal_kv_put(
                self._kp + key, value, True, self._ns, timeout=t
            ),
        )

    async def kv_delete(self, key: bytes) -> None:
        await self._gcs_call(
            "writing the table",
            lambda t: self._gcs().async_internal_kv_del(self._kp + key, False, self._ns, timeout=t),
        )

    async def kv_keys(self, prefix: bytes) -> list[bytes]:
        keys = await self._gcs_call(
            "reading the table",
            lambda t: self._gcs().async_internal_kv_keys(self._kp + prefix, self._ns, timeout=t),
        )
        return [k[len(self._kp) :] for k in keys]

    # ------------------------------------------------------------ nodes
    async def nodes(self) -> list[edge.NodeInfo]:
        return await asyncio.to_thread(node_infos)

    async def free_resources(self) -> dict[str, dict[str, float]]:
        return await asyncio.to_thread(ray._private.state.available_resources_per_node)

    async def node_events(self) -> list[edge.NodeEvent]:
        return await self._node_events.take()

    async def wait_for_events(self, timeout: float) -> None:
        await self._node_events.wait(timeout)

    async def dead_nodes(self, node_ids: list[str]) -> set[str]:
        if not node_ids:
            return set()
        ids = sorted(set(node_ids))
        wanted = [NodeID.from_hex(n) for n in ids]
        try:
            alive = await self._gcs_call(
                "asking which nodes are alive",
                lambda t: self._gcs().async_check_alive(wanted, t),
            )
        except TypeError:  # a Ray whose check_alive takes addresses (2.48)
            alive = await self._gcs_call(
                "asking which nodes are alive",
                lambda t: asyncio.to_thread(ray_gcs.alive_by_table, ids),
            )
        return {n for n, up in zip(ids, alive, strict=True) if not up}

    async def draining_nodes(self) -> dict[str, float]:
        draining = await self._gcs_call(
            "reading the draining nodes",
            lambda t: asyncio.to_thread(ray_gcs.draining_nodes, t),
        )
        return {n: ms / 1000.0 for n, ms in draining.items()}  # Ray: 0 for no deadline

    async def node_answers(
        self,
        addresses: dict[str, str],
        timeout: float,
        why: dict[str, str] | None = None,
        ways: dict[str, int] | None = None,
    ) -> dict[str, str]:
        return await asyncio.to_thread(answers.answers, addresses, timeout, why, ways or 1)

    def keep_witnesses(self, node_ids: list[str], away: set[str] = frozenset()) -> None:
        for gone in set(self._witnesses) - set(node_ids) - set(away):
            with contextlib.suppress(Exception):
                ray.kill(self._witnesses.pop(gone))
        for n in node_ids:
            if n not in self._witnesses:
                self._witnesses[n] = node_tasks.Witness.options(scheduling_strategy=_on(n)).remote()

    async def witness_answers(
        self, witness: str, addresses: dict[str, str], timeout: float, ways: int = 1
    ) -> dict[str, str] | None:
        actor = self._witnesses.get(witness)
        if actor is None:  # not kept there (yet): one that starts now, and stays
            self.keep_witnesses([*self._witnesses, witness])
            actor = self._witnesses[witness]
        ref = actor.ask.remote(addresses, timeout, ways)
        try:  # its own wait, and as long again for the call to arrive and reply
            return await asyncio.wait_for(_result(ref), 2 * timeout + WITNESS_SLACK)
        except Exception as e:  # its node lost, or late: this witness says nothing
            log.info("witness %s did not reply: %s", witness[:12], type(e).__name__)
            if not isinstance(e, asyncio.TimeoutError):
                self._witnesses.pop(witness, None)  # dead: made anew when next wanted
            return None

    async def fence(self, node_id: str, why: str) -> None:
        gcs = ray.get_runtime_context().gcs_address
        await asyncio.to_thread(fence_node, gcs, node_id, why)

    def watching(self) -> str:
        return self._node_events.watching()

    # ------------------------------------------------------------ placement groups
    async def create_group(self, name: str, bundles: list[dict[str, float]], node_id: str) -> str:
        pin = pin_options(node_id, len(bundles))

        def make() -> str:
            pg = placement_group(bundles, name=name, lifetime="detached", **pin)
            return pg.id.hex()

        gid = await asyncio.to_thread(make)
        if "_soft_target_node_id" in pin:
            self._soft_pins[gid] = node_id
        return gid

    async def create_demand(self, name: str, group: DemandGroup) -> str:
        def make() -> str:
            pg = placement_group(
                group.bundles,
                strategy=group.strategy,
                name=name,
                bundle_label_selector=[group.selector()] * len(group.bundles),
            )  # not detached: it goes with the controller that holds it
            return pg.id.hex()

        return await asyncio.to_thread(make)

    async def wait_group(self, group_id: str, timeout: float) -> bool:
        try:
            await asyncio.wait_for(_result(group_handle(group_id).ready()), timeout)
        except asyncio.TimeoutError:
            self._soft_pins.pop(group_id, None)  # the caller removes the group
            return False
        target = self._soft_pins.pop(group_id, None)
        if target is None:
            return True
        placed = (await self.groups([group_id])).get(group_id)
        if placed is not None and set(placed.nodes) == {target}:
            return True
        # A hint Ray did not follow (the node had no room a moment ago): a group on
        # another node is no pin; the slot stays unplaced and the reserve says so.
        where = ", ".join(sorted({n[:12] for n in placed.nodes})) if placed else "nowhere"
        log.warning(
            "Ray %s placed group %s on %s, not on its node %s: removed (%s)",
            installed(),
            group_id[:12],
            where,
            target[:12],
            "Ray 2.49 pins it",
        )
        await self.remove_group(group_id)
        return False

    async def remove_group(self, group_id: str) -> None:
        await asyncio.to_thread(ray.util.remove_placement_group, group_handle(group_id))

    async def groups(self, ids: list[str] | None = None) -> dict[str, edge.GroupInfo]:
        def read() -> dict[str, edge.GroupInfo]:
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
    async def probe(self, group_id: str, bundle_index: int, accelerator: str) -> edge.DeviceInfo:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        request = (
            {"num_gpus": PROBE_SHARE}
            if accelerator == "GPU"
            else {"resources": {accelerator: PROBE_SHARE}}
        )
        ref = node_tasks.probe.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group_handle(group_id), placement_group_bundle_index=bundle_index
            ),
            **request,
        ).remote(accelerator)
        return edge.DeviceInfo(**(await _result(ref)))

    async def free_ports(self, node_id: str, candidates: list[int]) -> list[int]:
        ref = node_tasks.free_ports.options(scheduling_strategy=_on(node_id)).remote(candidates)
        return await _result(ref)

    async def end_leftovers(self, node_id: str, uid: str, ray_workers: bool = False) -> list[str]:
        task = node_tasks.end_leftovers.options(scheduling_strategy=_on(node_id))
        return await _result(task.remote(uid, ray_workers))

    def detection_bound(self) -> float:
        return detection_bound(ray._config)

    def warm(self, node_id: str) -> None:
        node_tasks.warm.options(scheduling_strategy=_on(node_id)).remote()

    def own_node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def gcs_store(self) -> str:
        return gcs_store(os.environ, installed())

    def ray_version(self) -> str:
        return installed()


def _log_wait(message: str) -> None:
    log.warning("%s", message)


# A kept witness answers in milliseconds; one started for the question first starts a
# process (about a second on a loaded 2-core machine).
WITNESS_SLACK = 1.0
PROBE_SHARE = 0.0001  # a sliver of the accelerator, so Ray shows the probe its device


async def _result(ref: ray.ObjectRef):
    """Await an ObjectRef so that cancelling the waiter never cancels Ray's own future
    (Ray then fails an internal assertion as it sets the result)."""
    return await asyncio.shield(asyncio.wrap_future(ref.future()))


def pin_options(node_id: str, n: int) -> dict:
    """How a group of ``n`` bundles is pinned to ``node_id`` on the installed Ray."""
    if has(PIN_BY_LABEL, installed()):
        return {"strategy": "PACK", "bundle_label_selector": [{"ray.io/node-id": node_id}] * n}
    # Ray 2.48 places a group's bundles without reading their label selectors (Ray issue
    # 55590); its one way to aim a group at a node is a soft hint, which wait_group checks.
    return {"strategy": "STRICT_PACK", "_soft_target_node_id": node_id}


def _on(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)
