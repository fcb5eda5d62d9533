"""Placement strategies, one per module, as in RLinf's placement package.

Every strategy answers ``get_placement(view, isolate_gpu=True)`` with one
:class:`~controller.planning.placement.Placement` per process, in rank order. The YAML
parser builds :class:`FlexiblePlacementStrategy` (accelerator and hardware groups) and
:class:`NodePlacementStrategy` (node-only groups); the packed and strided strategies are
for code that places workers without a configuration file.
"""

from controller.planning.strategies.base import PlacementStrategy
from controller.planning.strategies.flexible import FlexiblePlacementStrategy
from controller.planning.strategies.node import NodePlacementStrategy
from controller.planning.strategies.packed import PackedPlacementStrategy
from controller.planning.strategies.strided import StridedPlacementStrategy

__all__ = [
    "FlexiblePlacementStrategy",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "PlacementStrategy",
    "StridedPlacementStrategy",
]
