"""A record's bundle as Ray's scheduling options: where the records meet Ray.

A driver starts a process in its slot with ``Assignment.actor_options()``, whose
``scheduling_strategy`` is Ray's own object: a placement group's handle and a bundle
index. Everything else of ``controller.state`` is plain data that reads without Ray;
this module imports Ray only when a strategy is asked for, so ``import controller`` and
a dry run on a laptop never do.

The controller's own Ray calls (:mod:`controller.runtime.edge.ray_io`) take their group
handles from here too: one cache of handles per process.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=4096)
def group_handle(group_id: str) -> Any:
    """A handle to a placement group from its hex id (names are namespace-scoped; ids
    are not). Handles are cached: each one caches its bundles after the first lookup,
    which saves a GCS round trip for every actor scheduled into the group."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    return PlacementGroup(PlacementGroupID(bytes.fromhex(group_id)))


def strategy(group_id: str, bundle_index: int, capture_child_tasks: bool) -> Any:
    """Ray's strategy that starts a process in bundle ``bundle_index`` of the group
    ``group_id`` (its children inside the group too when ``capture_child_tasks``)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=group_handle(group_id),
        placement_group_bundle_index=bundle_index,
        placement_group_capture_child_tasks=capture_child_tasks,
    )


__all__ = ["group_handle", "strategy"]
