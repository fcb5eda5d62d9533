"""How RLinf's view of nodes and devices is made to agree with a placectl reservation.

Used by :mod:`clients.integrations.rlinf` (see its docstring for the rules and what they
rely on in RLinf 0.3.0): the node probe that numbers RLinf's nodes by the reservation and
waits out a node Ray still lists alive after it died, and the check of each rank RLinf
places against the bundle placectl holds for it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import ray

from clients.integrations import rlinf_missing
from controller.errors import PlacementError
from controller.planning.node_groups import ACCELERATOR, NODE
from controller.state.assignments import Assignment

try:
    from rlinf.scheduler.cluster.cluster import Cluster
    from rlinf.scheduler.cluster.node import NodeProbe
except ImportError as e:  # pragma: no cover - exercised only without rlinf
    raise rlinf_missing(e) from None

ordering = threading.local()  # .cluster: the ReservedCluster whose constructor probes nodes


class ReservationOrder(NodeProbe):
    """RLinf's node probe, numbering the nodes by the reservation where no node sets
    ``RLINF_NODE_RANK`` (RLinf's own rule for that case is left to run otherwise).

    It first waits for the reservation to be ready. A node that died but that Ray still
    lists alive (the seconds after a node loss, when a restarted driver typically starts)
    fails RLinf's probe of it; the probe is then tried again once Ray has marked the
    node dead and the reservation is repaired, instead of the driver failing.
    """

    def __init__(self, cluster_num_nodes: int, cluster_cfg: Any) -> None:
        owner = getattr(ordering, "cluster", None)
        if owner is None:
            super().__init__(cluster_num_nodes, cluster_cfg)
            return
        owner.reserve()
        deadline = time.monotonic() + owner.timeout_s
        while True:
            listed = {n["NodeID"] for n in Cluster.get_alive_nodes()}
            try:
                super().__init__(cluster_num_nodes, cluster_cfg)
                return
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError):
                if time.monotonic() > deadline:
                    raise
            print(
                f"placectl: {owner.job}: RLinf's probe of a node failed; waiting for Ray to "
                "mark it dead and for the reservation's repair",
                file=sys.stderr,
                flush=True,
            )
            for probe in self._probes:
                ray.kill(probe, no_restart=True)
            while {n["NodeID"] for n in Cluster.get_alive_nodes()} >= listed:
                if time.monotonic() > deadline:
                    raise PlacementError(
                        f"RLinf's probe of a node failed and Ray still lists every node alive "
                        f"after {owner.timeout_s:g}s"
                    )
                time.sleep(0.25)
            _wait_names_free([f"NodeProbe_{n}" for n in listed], deadline)
            owner.reservation.wait_ready(timeout=max(deadline - time.monotonic(), 1.0))

    def _sort_nodes(self, cluster_num_nodes: int) -> None:
        owner = getattr(ordering, "cluster", None)
        if owner is not None and all(n.node_rank == -1 for n in self._nodes):
            owner.number_nodes(self._nodes)
        super()._sort_nodes(cluster_num_nodes)


def _wait_names_free(names: list[str], deadline: float) -> None:
    """Until no actor holds these names (killed probes release them asynchronously)."""
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name)
            except ValueError:
                break
            time.sleep(0.1)


def check_rank(cluster: Any, component: str, p: Any, a: Assignment) -> None:
    """Refuse a rank RLinf would start elsewhere than placectl holds for it."""
    node = cluster.get_node_info(p.cluster_node_rank)
    where = f"{component}:{p.rank}"
    if node.ray_id != a.placement.node_id:
        raise PlacementError(
            f"{where}: RLinf places it on its node {p.cluster_node_rank} ({node.node_ip}, "
            f"{node.ray_id[:8]}), placectl holds node rank {a.placement.node_rank} "
            f"({a.placement.node_ip}, {a.placement.node_id[:8]}): RLINF_NODE_RANK orders "
            "RLinf's nodes otherwise than the reservation; unset it on every node (a "
            "ReservedCluster then numbers them by the reservation) or make it equal to "
            "the placectl.io/node-rank label"
        )
    if a.placement.kind == NODE:
        return
    held = [int(x) for x in p.local_hardware_ranks]
    if held != list(a.placement.local_resource_ranks):
        raise PlacementError(
            f"{where}: RLinf holds local {a.placement.kind} {held}, placectl "
            f"{list(a.placement.local_resource_ranks)}"
        )
    if a.placement.kind != ACCELERATOR:
        return
    physical = list(a.placement.cuda_visible_devices)
    rlinf_first = int(p.local_accelerator_rank)
    shown = [int(x) for x in p.visible_accelerators]
    if rlinf_first != a.placement.local_gpu_id or (
        a.placement.isolate_gpu and p.isolate_accelerator and shown != physical
    ):
        raise PlacementError(
            f"{where}: RLinf shows it accelerator(s) {shown} of node {node.node_ip}, Ray "
            f"granted its bundle {physical}: RLinf numbers a node's accelerators from 0, so "
            "another job holds the ones this configuration names; reserve nodes of "
            "your own for an RLinf job"
        )


__all__ = ["ReservationOrder", "check_rank", "ordering"]
