"""Ray at the edges: handles by id, the live cluster, and the accelerator probe.

Imported lazily; ``import controller`` never imports this module.
"""

from __future__ import annotations

import functools

import ray
from ray._raylet import PlacementGroupID
from ray.util.placement_group import PlacementGroup

from controller.cluster import ClusterView, view_from_ray_nodes
from controller.probe import probe


@functools.lru_cache(maxsize=4096)
def group_handle(group_id: str) -> PlacementGroup:
    """A handle to a placement group from its hex id (names are namespace-scoped; ids
    are not). Handles are cached: each one caches its bundles after the first lookup,
    which saves a GCS round trip for every actor scheduled into the group."""
    return PlacementGroup(PlacementGroupID(bytes.fromhex(group_id)))


def live_view(accelerator: str) -> ClusterView:
    """The alive nodes of the cluster, in node-rank order."""
    return view_from_ray_nodes(ray.nodes(), accelerator)


def free_resources() -> dict[str, dict[str, float]]:
    """Available resources per node id."""
    return ray._private.state.available_resources_per_node()


def head_node_id() -> str | None:
    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in (n.get("Resources") or {}):
            return n["NodeID"]
    return None


PROBE_SHARE = 0.0001


def probe_ref(group_id: str, bundle_index: int, accelerator: str) -> ray.ObjectRef:
    """Start a probe in a bundle; it answers the physical accelerator ids it sees.

    The probe is a task (not an actor) asking for a sliver of the accelerator, so that
    Ray shows it the bundle's device; ``max_calls=0`` lets one warm worker per node
    answer all of that node's probes.
    """
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    request = (
        {"num_gpus": PROBE_SHARE}
        if accelerator == "GPU"
        else {"resources": {accelerator: PROBE_SHARE}}
    )
    return probe.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            group_handle(group_id), placement_group_bundle_index=bundle_index
        ),
        **request,
    ).remote(accelerator)


def warm(node_id: str) -> ray.ObjectRef:
    """Start (or touch) an idle worker on a node, so that the first probe there does not
    wait for a worker process to start."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return probe.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote("GPU")


def free_ports_on(node_id: str, candidates: list[int], count: int, consecutive: bool):
    """Ask a task on ``node_id`` which of ``candidates`` are free there (ObjectRef)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from controller.probe import free_ports

    return free_ports.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote(candidates, count, consecutive)
