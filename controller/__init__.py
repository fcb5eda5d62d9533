"""placectl's cluster side: the planning core (no Ray) and, lazily, the controller actor.

Importing this package never imports Ray: the planning API below is usable for dry runs
on a laptop and unit tests in milliseconds.
"""

from controller.cluster import ClusterView, NodeView
from controller.colocation import AcceleratorUse
from controller.components import ComponentPlacement
from controller.errors import (
    ColocationError,
    PlacementError,
    PlacementStringError,
    SpecError,
)
from controller.placement import Placement
from controller.spec import ClusterSpec, ComponentSpec, NodeGroup, load_spec
from controller.strategies import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementStrategy,
    StridedPlacementStrategy,
)

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
