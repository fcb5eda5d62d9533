"""The local multi-node Ray cluster placectl's tests, benchmarks, chaos runs and tools
start: one place for its shape, so that what one measures is what another tests."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from controller.runtime.edge.answers import TEST_HOOKS

HEAD = {"num_cpus": 2, "num_gpus": 0}
GPUS_PER_NODE = 4
# Ray gives a starting node 30 s to register with the GCS; on 2 loaded cores a raylet
# once never did (CI, a head between two test modules: no raylet log at all), and the
# half-started node's GCS ran on for 20 minutes. Such a start is cleaned up and tried
# again, this many times in all.
STARTS = 3
# How Ray 2.60 says a node did not come up in time: a raylet that did not register with
# the GCS, and a GCS server that did not write its port file (seen in CI: the head of a
# module's cluster, started while the last one's processes still exited on 2 cores).
_TIMED_OUT = ("timed out during startup", "timed out waiting for file")
T = TypeVar("T")


def started(start: Callable[[], T], what: str) -> T:
    """``start()`` (a Ray node's start), again after a start that timed out: the
    processes that start left behind are killed first (the children this process
    started meanwhile, and theirs; not the workers an older node started meanwhile).
    Any other error is raised as it is."""
    import psutil

    me = psutil.Process()
    for attempt in range(1, STARTS + 1):
        before = {p.pid for p in me.children()}
        try:
            return start()
        except Exception as e:
            if not any(t in str(e).lower() for t in _TIMED_OUT) or attempt == STARTS:
                raise
            new = [p for p in me.children() if p.pid not in before]
            left = new + [d for p in new for d in _descendants(p)]
            for p in left:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            psutil.wait_procs(left, timeout=30)
            print(
                f"local_cluster: the {what} did not come up in time ({e}) "
                f"(start {attempt} of {STARTS}); killed its {len(left)} processes, "
                "starting it again",
                file=sys.stderr,
            )
    raise AssertionError("unreachable")


def _descendants(p: Any) -> list[Any]:
    import psutil

    try:
        return p.children(recursive=True)
    except psutil.Error:
        return []


@contextlib.contextmanager
def local_cluster(
    gpu_nodes: int = 0,
    *,
    gpus: int = GPUS_PER_NODE,
    cpus: int | None = None,
    head: dict[str, Any] | None = None,
    nodes: list[dict[str, Any]] = (),
    env: dict[str, str] | None = None,
    connect: bool = True,
    log_level: str = "WARNING",
    dashboard: bool = False,
) -> Iterator[tuple[Any, list[Any]]]:
    """A head without GPUs (the controller is pinned there) and ``gpu_nodes`` nodes of
    ``gpus`` fake GPUs each, with as many CPUs unless ``cpus``; this process connected
    unless not ``connect``. Yields ``(cluster, nodes)``: Ray's
    ``ray.cluster_utils.Cluster`` and the GPU nodes in the order they were added.

    Args:
        head: the head's arguments to ``Cluster`` (default: 2 CPUs, no GPUs), e.g. a
            ``_system_config`` or a ``metrics_export_port``.
        nodes: the arguments of more nodes, added after the GPU nodes (nodes of other
            shapes, labels or resources); they are yielded with them.
        env: variables every process of the cluster sees (``PYTHONPATH`` for a
            framework's stand-ins), set for the cluster's life and restored after.
        dashboard: start Ray's dashboard on the head (unless ``head`` says). Off by
            default: nothing here reads it, and idle it costs a quarter of a core (a
            local cluster of 4 nodes: 33% of one core with it, 9% without), which two
            cores running the tests feel.
    """
    import ray
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault(TEST_HOOKS, "1")  # a controller here answers the tests' hooks
    head_args = {"include_dashboard": dashboard, **(head or HEAD)}
    cluster = started(lambda: Cluster(initialize_head=True, head_node_args=head_args), "head")
    try:
        uniform = {"num_cpus": gpus if cpus is None else cpus, "num_gpus": gpus}
        added = [
            started(lambda a=args: cluster.add_node(**a), "node")
            for args in [uniform] * gpu_nodes + list(nodes)
        ]
        cluster.wait_for_nodes()
        if connect:
            attach_drivers_to_the_head()
            ray.init(address=cluster.address, logging_level=log_level, log_to_driver=False)
        yield cluster, added
    finally:
        if connect:
            ray.shutdown()
        cluster.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def attach_drivers_to_the_head() -> None:
    """Have a driver this process starts attach to the head's raylet, as Ray 2.55 and
    later do among the raylets at the driver's address (every node of a local cluster has
    one address). Ray 2.48 takes one of the others: a test that removes that node then
    removes the driver's own raylet, which Ray refuses (``Cluster.remove_node``) or which
    breaks the driver. A no-op on a Ray that prefers the head itself."""
    import inspect

    from ray._private import services
    from ray._raylet import GcsClient
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    choose = services.get_node_to_connect_for_driver
    if "node_name" in inspect.signature(choose).parameters or hasattr(choose, "placectl"):
        return

    def head_first(gcs_address, node_ip_address):
        for node_id, n in GcsClient(address=gcs_address).get_all_node_info().items():
            alive = n.state == GcsNodeInfo.GcsNodeState.ALIVE
            if n.is_head_node and alive and n.node_manager_address == node_ip_address:
                return {  # what Ray 2.48's own choice holds
                    "node_id": node_id.hex(),
                    "node_manager_port": n.node_manager_port,
                    "raylet_socket_name": n.raylet_socket_name,
                    "object_store_socket_name": n.object_store_socket_name,
                }
        return choose(gcs_address, node_ip_address)

    head_first.placectl = True
    services.get_node_to_connect_for_driver = head_first
