"""placectl's cluster side: the planning core (no Ray) and, lazily, the controller actor.

Importing this package never imports Ray, and loads nothing until a name is used: the
planning API below is usable for dry runs on a laptop and unit tests in milliseconds,
and a probe worker that imports ``controller.probe`` pays for nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AcceleratorUse": "controller.colocation",
    "ClusterSpec": "controller.spec",
    "ClusterView": "controller.cluster",
    "ColocationError": "controller.errors",
    "ComponentPlacement": "controller.components",
    "ComponentSpec": "controller.spec",
    "FlexiblePlacementStrategy": "controller.strategies",
    "NodeGroup": "controller.spec",
    "NodePlacementStrategy": "controller.strategies",
    "NodeView": "controller.cluster",
    "PackedPlacementStrategy": "controller.strategies",
    "Placement": "controller.placement",
    "PlacementError": "controller.errors",
    "PlacementStrategy": "controller.strategies",
    "PlacementStringError": "controller.errors",
    "SpecError": "controller.errors",
    "StridedPlacementStrategy": "controller.strategies",
    "load_spec": "controller.spec",
}

__all__ = [
    "AcceleratorUse",
    "ClusterSpec",
    "ClusterView",
    "ColocationError",
    "ComponentPlacement",
    "ComponentSpec",
    "FlexiblePlacementStrategy",
    "NodeGroup",
    "NodePlacementStrategy",
    "NodeView",
    "PackedPlacementStrategy",
    "Placement",
    "PlacementError",
    "PlacementStrategy",
    "PlacementStringError",
    "SpecError",
    "StridedPlacementStrategy",
    "load_spec",
]

if TYPE_CHECKING:
    from controller.cluster import ClusterView, NodeView
    from controller.colocation import AcceleratorUse
    from controller.components import ComponentPlacement
    from controller.errors import ColocationError, PlacementError, PlacementStringError, SpecError
    from controller.placement import Placement
    from controller.spec import ClusterSpec, ComponentSpec, NodeGroup, load_spec
    from controller.strategies import (
        FlexiblePlacementStrategy,
        NodePlacementStrategy,
        PackedPlacementStrategy,
        PlacementStrategy,
        StridedPlacementStrategy,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'controller' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
