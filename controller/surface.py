"""What clients use of the controller's runtime, in one place.

Drivers, workers and the CLI (``clients``) build on the records and errors
(``controller.state``, ``controller.errors``) and on a few pieces of the runtime, named
here and nowhere else: ``clients`` never import ``controller.runtime`` itself
(``tests/unit/test_layers.py``), so what they rely on is this list, and the runtime is
free to move everything else.

* starting the controller: :class:`PlacementController`, the settings it is started
  with (:func:`settings_by_name`), and the head's marker resource
  (:data:`HEAD_RESOURCE`) it is pinned by;
* health checks of Ray's processes, as the controller asks them: :func:`answers` and
  its answers (:data:`OK`, :data:`REFUSED`, :data:`DENIED`, :data:`DOUBT_WAYS`);
* tasks that find and end what a worker left on its node: :data:`TAG`, :func:`new_tag`,
  :func:`end_tagged`, :class:`Ended`;
* the GCS, read with the controller's retry on a GCS that does not answer:
  :func:`gcs_retry`, :func:`gcs_unavailable`, :func:`gcs_bound_s`, and what every Ray
  release answers the same way: :func:`draining_nodes`, :func:`alive_by_table`;
* the alive nodes, in node-rank order, as the controller sees them: :func:`node_view`.

Each name loads its module on first use (as ``import controller`` does): a worker that
needs one task helper pays for nothing else, and nothing here imports Ray until used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PlacementController": ("controller.runtime.controller", "PlacementController"),
    "settings_by_name": ("controller.runtime.core.settings", "by_name"),
    "HEAD_RESOURCE": ("controller.runtime.edge", "HEAD_RESOURCE"),
    "answers": ("controller.runtime.edge.answers", "answers"),
    "OK": ("controller.runtime.edge.answers", "OK"),
    "REFUSED": ("controller.runtime.edge.answers", "REFUSED"),
    "DENIED": ("controller.runtime.edge.answers", "DENIED"),
    "DOUBT_WAYS": ("controller.runtime.edge.answers", "DOUBT_WAYS"),
    "TAG": ("controller.runtime.edge.node_tasks", "TAG"),
    "new_tag": ("controller.runtime.edge.node_tasks", "new_tag"),
    "end_tagged": ("controller.runtime.edge.node_tasks", "end_tagged"),
    "Ended": ("controller.runtime.edge.node_tasks", "Ended"),
    "gcs_retry": ("controller.runtime.edge.ray_gcs", "retry"),
    "gcs_unavailable": ("controller.runtime.edge.ray_gcs", "gcs_unavailable"),
    "gcs_bound_s": ("controller.runtime.edge.ray_gcs", "bound_s"),
    "draining_nodes": ("controller.runtime.edge.ray_gcs", "draining_nodes"),
    "alive_by_table": ("controller.runtime.edge.ray_gcs", "alive_by_table"),
}


def node_view(accelerator: str = "GPU"):
    """The alive nodes of the cluster this process is connected to, in node-rank order
    (a :class:`~controller.planning.cluster.ClusterView`; one blocking GCS read)."""
    from controller.runtime.core.nodes import live_view
    from controller.runtime.edge.ray_io import node_infos

    return live_view(node_infos(), accelerator)


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


__all__ = [*_EXPORTS, "node_view"]
