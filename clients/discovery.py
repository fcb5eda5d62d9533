"""The running cluster, as a dry run sees it: only when one is already up."""

from __future__ import annotations

from controller.planning.cluster import ClusterView


def running_cluster_view(accelerator: str = "GPU") -> ClusterView | None:
    """The alive nodes of the Ray cluster this machine is part of, in node-rank order;
    None when no cluster is running (this never starts one)."""
    import ray

    if not ray.is_initialized():
        try:
            ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError):
            return None
    from controller.surface import node_view

    return node_view(accelerator)
