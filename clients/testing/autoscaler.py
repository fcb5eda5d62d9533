"""An autoscaler for a local cluster (``ray.cluster_utils.Cluster``): it adds nodes only
for the demand Ray reports, and removes the nodes it added once they are idle.

It reads what Ray's own autoscaler (v2) reads, the GCS's cluster resource state
(``ray.autoscaler.v2.sdk.get_cluster_resource_state``): pending placement groups (with
their strategies and label selectors) and pending tasks and actors, against each live
node's available resources. It launches nodes of one shape, as a KubeRay worker group
of ``minReplicas: 0`` does, each a process of its own as a pod runs one
(``ray start --block``, which Ray drains on SIGTERM), and terminates an idle node as
Ray's does: a drain with reason ``IDLE_TERMINATION``, which the node refuses if
anything runs there, then SIGTERM. Ray's own ``AutoscalingCluster`` helper does not
start in the Ray 2.60 wheel (its fake provider's monitor fails), hence this one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import ray
from ray._raylet import GcsClient
from ray.autoscaler.v2.sdk import get_cluster_resource_state
from ray.core.generated import autoscaler_pb2, common_pb2

_ALIVE = (autoscaler_pb2.NodeStatus.RUNNING, autoscaler_pb2.NodeStatus.IDLE)
# Selector operators came with bundles' label selectors (Ray 2.49); on 2.48 placectl shows
# no demand (controller.ray_versions.DEMAND_SELECTORS), and no selector reaches here.
_OPERATOR = getattr(common_pb2, "LabelSelectorOperator", None)
_IN = _OPERATOR.LABEL_OPERATOR_IN if _OPERATOR is not None else None
_NOT_IN = _OPERATOR.LABEL_OPERATOR_NOT_IN if _OPERATOR is not None else None


def _matches(selectors, labels: dict[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies one of ``selectors`` (none: any node)."""
    if not selectors:
        return True
    for selector in selectors:
        ok = True
        for c in selector.label_constraints:
            value = labels.get(c.label_key)
            if (c.operator == _IN and value not in c.label_values) or (
                c.operator == _NOT_IN and value in c.label_values
            ):
                ok = False
                break
        if ok:
            return True
    return False


def _fits(free: dict[str, float], bundle: dict[str, float]) -> bool:
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items())


def _take(free: dict[str, float], bundle: dict[str, float]) -> None:
    for k, v in bundle.items():
        free[k] = free.get(k, 0.0) - v


class _Slot:
    """A node as this autoscaler simulates it: what is free, its labels, and whether it
    is one it would launch."""

    def __init__(self, free: dict[str, float], labels: dict[str, str], new: bool) -> None:
        self.free, self.labels, self.new = dict(free), dict(labels), new


class ProcessNode:
    """A node as a KubeRay pod runs one: a ``ray start --block`` process of its own.

    Args:
        address: the cluster's GCS address.
        name: the node's name (``ray.nodes()``'s ``NodeName``), unique in the cluster.
        num_cpus, num_gpus, labels: what it offers.
    """

    _RAY = os.path.join(os.path.dirname(sys.executable), "ray")

    def __init__(self, address: str, name: str, num_cpus: int, num_gpus: int, labels) -> None:
        self.name = name
        args = [self._RAY, "start", "--block", "--disable-usage-stats", "--address", address]
        args += ["--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus), "--node-name", name]
        if labels:
            args += ["--labels", ",".join(f"{k}={v}" for k, v in labels.items())]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self.node_id = ""

    def wait_alive(self, timeout: float = 60.0) -> str:
        """Until Ray lists the node alive; its node id."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n in ray.nodes():
                if n["NodeName"] == self.name and n["Alive"]:
                    self.node_id = n["NodeID"]
                    return self.node_id
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited ({self.proc.returncode})")
            time.sleep(0.1)
        raise TimeoutError(f"node {self.name} not alive after {timeout}s")

    def evict(self) -> None:
        """What a pod deleted or evicted gets: SIGTERM. Ray drains the node (PREEMPTION,
        a 30 s deadline) and stops it once idle or at the deadline."""
        self.proc.send_signal(signal.SIGTERM)

    def crash(self) -> None:
        """The machine dies at once: every process of the node killed, nobody told."""
        with contextlib.suppress(psutil.NoSuchProcess):
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
            for p in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
        self.proc.wait()

    def wait_gone(self, timeout: float = 60.0) -> None:
        """Until the node's process has exited (SIGKILL after ``timeout``)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.crash()


class LocalAutoscaler:
    """Adds nodes of one shape to ``cluster`` for the demand Ray reports.

    Args:
        cluster: a ``ray.cluster_utils.Cluster`` (or anything with the GCS ``address``).
        num_gpus, num_cpus, labels: the shape of every node it launches (its labels
            include ``ray.io/node-group`` = ``node_type``, as Ray sets for a node type).
        max_nodes: the most nodes it has running at once.
        idle_timeout_s: a node it launched and nothing has used for this long goes.
        period_s: how often it reads the demand.
    """

    def __init__(
        self,
        cluster,
        num_gpus: int = 4,
        num_cpus: int = 4,
        labels: dict[str, str] | None = None,
        node_type: str = "gpu-workers",
        max_nodes: int = 4,
        idle_timeout_s: float = 5.0,
        period_s: float = 0.5,
    ) -> None:
        self.cluster = cluster
        self.shape = {"GPU": float(num_gpus), "CPU": float(num_cpus)}
        self.labels = {"ray.io/node-group": node_type, **(labels or {})}
        self.max_nodes = max_nodes
        self.idle_timeout_s = idle_timeout_s
        self.period_s = period_s
        self.launched: dict[str, ProcessNode] = {}  # node id -> the node
        self._launching = 0  # nodes started whose node id is not known yet
        # A real autoscaler starts a batch of nodes at once; this one starts them one by
        # one, so the first idles while the others start. Idle time counts only from the
        # last pass that saw demand or launched (on a loaded CI machine a first node of
        # two idled past 15 s and went just before the group was placed on it).
        self._demand_at = time.monotonic()
        self._names = itertools.count(1)
        self.terminated: list[str] = []
        self.log: list[tuple[float, str]] = []  # (time, what it did)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gcs = GcsClient(address=cluster.address)

    # ------------------------------------------------------------ running it
    def start(self) -> LocalAutoscaler:
        self._thread = threading.Thread(target=self._run, name="local-autoscaler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop scaling; every node it launched goes (SIGTERM)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        for node in self.launched.values():
            if node.proc.poll() is None:
                node.evict()
        for node in self.launched.values():
            node.wait_gone(timeout=60)

    def __enter__(self) -> LocalAutoscaler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def settle(self, timeout: float = 60.0) -> dict[str, ProcessNode]:
        """``launched`` once no launch is in progress. Ray may use a new node (place a
        group on it) the moment it registers, a little before this scaler has read its
        id: read ``launched`` after something ran on a node it added through this."""
        deadline = time.monotonic() + timeout
        while self._launching and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.launched

    def running(self) -> list[str]:
        """The nodes it launched whose process still runs."""
        return [n for n, node in self.launched.items() if node.proc.poll() is None]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as e:  # a GCS blip: the next period tries again
                self.log.append((time.time(), f"error: {e}"))
            self._stop.wait(self.period_s)

    # ------------------------------------------------------------ one pass
    def step(self) -> None:
        """Read the demand once; launch what it needs, terminate what is idle."""
        state = get_cluster_resource_state(self._gcs)
        alive = [n for n in state.node_states if n.status in _ALIVE]
        slots = [_Slot(dict(n.available_resources), dict(n.labels), False) for n in alive]
        # A node it launched whose resources Ray has not reported yet counts as empty,
        # as an autoscaler counts its pending launches: else it would launch it twice.
        reported = {n.node_id.hex() for n in state.node_states if n.total_resources}
        for node_id in self.running():
            if node_id not in reported:
                labels = {**self.labels, "ray.io/node-id": node_id}
                slots.append(_Slot(self.shape, labels, False))
        needed = self._new_nodes(state, slots)
        room = self.max_nodes - len(self.running())
        self._launching = min(needed, room)
        if needed:
            seen = ", ".join(
                f"{n.node_id.hex()[:8]} {autoscaler_pb2.NodeStatus.Name(n.status)} "
                f"GPU {n.available_resources.get('GPU', 0):g}/{n.total_resources.get('GPU', 0):g}"
                for n in state.node_states
            )
            self.log.append(
                (
                    time.time(),
                    f"demand: {len(state.pending_gang_resource_requests)} group(s), "
                    f"{len(state.pending_resource_requests)} shape(s); nodes: {seen}; "
                    f"launching {self._launching}",
                )
            )
        for _ in range(self._launching):  # one at a time: two `ray start` on one
            node = ProcessNode(  # host at once can collide on a port
                self.cluster.address,
                f"autoscaled-{os.getpid()}-{next(self._names)}",
                int(self.shape["CPU"]),
                int(self.shape["GPU"]),
                self.labels,
            )
            try:
                node.wait_alive()
            except Exception as e:
                node.crash()
                self.log.append((time.time(), f"a node failed to start: {e}"))
                continue
            finally:
                self._launching -= 1
            self.launched[node.node_id] = node
            self.log.append((time.time(), f"launched {node.node_id[:12]}"))
        if needed or state.pending_gang_resource_requests or state.pending_resource_requests:
            self._demand_at = time.monotonic()
        elif time.monotonic() - self._demand_at >= self.idle_timeout_s:
            self._terminate_idle(alive)  # never a node that pending demand may yet take

    def _new_nodes(self, state, slots: list[_Slot]) -> int:
        """How many nodes of this shape the pending demand needs beside the live ones."""
        new: list[_Slot] = []

        def place(bundle: dict[str, float], selectors, avoid: set[int]) -> int | None:
            for i, s in enumerate(slots + new):
                if i not in avoid and _fits(s.free, bundle) and _matches(selectors, s.labels):
                    _take(s.free, bundle)
                    return i
            fresh = _Slot(self.shape, self.labels, True)
            if not _fits(fresh.free, bundle) or not _matches(selectors, fresh.labels):
                return None  # no node of this shape could take it: not ours to launch
            _take(fresh.free, bundle)
            new.append(fresh)
            return len(slots) + len(new) - 1

        for gang in state.pending_gang_resource_requests:
            # Ray 2.60 states each bundle with its label selector in the first of the
            # gang's bundle selectors (the others are fallbacks); ``requests`` lacks them.
            requests = list(
                gang.bundle_selectors[0].resource_requests
                if gang.bundle_selectors
                else gang.requests
            )
            packed = any(c.HasField("affinity") for r in requests for c in r.placement_constraints)
            spread = any(
                c.HasField("anti_affinity") for r in requests for c in r.placement_constraints
            )
            if packed:  # STRICT_PACK: one node takes the sum
                total: dict[str, float] = {}
                for r in requests:
                    for k, v in r.resources_bundle.items():
                        total[k] = total.get(k, 0.0) + v
                requests = [(total, requests[0].label_selectors)]
            else:
                requests = [(dict(r.resources_bundle), r.label_selectors) for r in requests]
            used: set[int] = set()
            for bundle, selectors in requests:
                i = place(bundle, selectors, used if spread else set())
                if i is not None:
                    used.add(i)
        for by_count in state.pending_resource_requests:
            for _ in range(by_count.count):
                place(
                    dict(by_count.request.resources_bundle), by_count.request.label_selectors, set()
                )
        return len(new)

    def _terminate_idle(self, alive) -> None:
        reason = autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_IDLE_TERMINATION
        for n in alive:
            node_id = n.node_id.hex()
            if node_id not in self.launched or node_id in self.terminated:
                continue
            if n.status != autoscaler_pb2.NodeStatus.IDLE:
                continue
            if n.idle_duration_ms < self.idle_timeout_s * 1000:
                continue
            accepted, _ = self._gcs.drain_node(node_id, reason, "idle", 0)
            if not accepted:  # something started there meanwhile: the node refuses
                continue
            self.launched[node_id].evict()
            self.terminated.append(node_id)
            self.log.append((time.time(), f"terminated idle {node_id[:12]}"))
