"""placectl's cluster side, in three layers:

* ``controller.planning``: the pure planning core (spec, rank grammar, cluster views,
  strategies, component placement);
* ``controller.state``: the persisted records and their pure derivations (slots,
  assignments, the worker environment, the port ledger, status, storage format);
* ``controller.runtime``: the controller actor, in layers of its own (the Ray edge, the
  core, the steps, the calls).

Importing this package never imports Ray, and loads nothing until a name is used: the
planning API below is usable for dry runs on a laptop and unit tests in milliseconds,
and a probe worker that imports ``controller.runtime.edge.node_tasks`` pays for little
else.

:func:`version`: placectl's version, the installed package's, else this source tree's.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AcceleratorUse": "controller.planning.colocation",
    "ClusterSpec": "controller.planning.spec",
    "ClusterView": "controller.planning.cluster",
    "ClusterUnavailable": "controller.errors",
    "NotOwner": "controller.errors",
    "PersistenceError": "controller.errors",
    "ReservationDegraded": "controller.errors",
    "ReservationInfeasible": "controller.errors",
    "StaleChange": "controller.errors",
    "StaleReservation": "controller.errors",
    "ColocationError": "controller.errors",
    "ReservationError": "controller.errors",
    "ReservationTimeout": "controller.errors",
    "ReservationConflict": "controller.errors",
    "ReservationCancelled": "controller.errors",
    "UnknownReservation": "controller.errors",
    "ControllerNotFound": "controller.errors",
    "TableUnreadable": "controller.errors",
    "ComponentPlacement": "controller.planning.components",
    "ComponentSpec": "controller.planning.spec",
    "FlexiblePlacementStrategy": "controller.planning.strategies",
    "NodeGroup": "controller.planning.spec",
    "NodePlacementStrategy": "controller.planning.strategies",
    "NodeView": "controller.planning.cluster",
    "PackedPlacementStrategy": "controller.planning.strategies",
    "Placement": "controller.planning.placement",
    "PlacementError": "controller.errors",
    "PlacementStrategy": "controller.planning.strategies",
    "PlacementStringError": "controller.errors",
    "SpecError": "controller.errors",
    "SettingsError": "controller.errors",
    "UndecidedNodes": "controller.errors",
    "StridedPlacementStrategy": "controller.planning.strategies",
    "load_spec": "controller.planning.spec",
}


if TYPE_CHECKING:
    from controller.errors import (
        ClusterUnavailable,
        ColocationError,
        ControllerNotFound,
        NotOwner,
        PersistenceError,
        PlacementError,
        PlacementStringError,
        ReservationCancelled,
        ReservationConflict,
        ReservationDegraded,
        ReservationError,
        ReservationInfeasible,
        ReservationTimeout,
        SettingsError,
        SpecError,
        StaleChange,
        StaleReservation,
        TableUnreadable,
        UndecidedNodes,
        UnknownReservation,
    )
    from controller.planning.cluster import ClusterView, NodeView
    from controller.planning.colocation import AcceleratorUse
    from controller.planning.components import ComponentPlacement
    from controller.planning.placement import Placement
    from controller.planning.spec import ClusterSpec, ComponentSpec, NodeGroup, load_spec
    from controller.planning.strategies import (
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


SOURCE_VERSION = "0.1.0"  # pyproject.toml's [project] version; a test keeps them equal


def version() -> str:
    """The version of the placectl this process runs."""
    try:
        return metadata.version("placectl")
    except metadata.PackageNotFoundError:
        return SOURCE_VERSION


__all__ = [
    "AcceleratorUse",
    "ClusterSpec",
    "ClusterUnavailable",
    "ClusterView",
    "ColocationError",
    "ComponentPlacement",
    "ComponentSpec",
    "ControllerNotFound",
    "FlexiblePlacementStrategy",
    "NodeGroup",
    "NodePlacementStrategy",
    "NodeView",
    "NotOwner",
    "PackedPlacementStrategy",
    "PersistenceError",
    "Placement",
    "PlacementError",
    "PlacementStrategy",
    "PlacementStringError",
    "ReservationCancelled",
    "ReservationConflict",
    "ReservationDegraded",
    "ReservationError",
    "ReservationInfeasible",
    "ReservationTimeout",
    "SettingsError",
    "SpecError",
    "StaleChange",
    "StaleReservation",
    "StridedPlacementStrategy",
    "TableUnreadable",
    "UndecidedNodes",
    "UnknownReservation",
    "load_spec",
]
