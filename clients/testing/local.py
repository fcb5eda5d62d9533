"""The local multi-node Ray cluster placectl's tests, benchmarks, chaos runs and tools
start: one place for its shape, so that what one measures is what another tests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from controller.runtime.channels import TEST_HOOKS

HEAD = {"num_cpus": 2, "num_gpus": 0}
GPUS_PER_NODE = 4


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
    cluster = Cluster(initialize_head=True, head_node_args=head_args)
    try:
        uniform = {"num_cpus": gpus if cpus is None else cpus, "num_gpus": gpus}
        added = [cluster.add_node(**args) for args in [uniform] * gpu_nodes + list(nodes)]
        cluster.wait_for_nodes()
        if connect:
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
