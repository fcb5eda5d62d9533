"""What drivers and workers import: attach to the controller, reserve, launch workers.

Importing this package does not import Ray; the names below load on first use.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "connect": "clients.session",
    "Controller": "clients.session",
    "Reservation": "clients.reservation",
    "WorkerGroup": "clients.workers",
    "current": "clients.inside",
    "GuardedGroup": "clients.collective",
    "preempt_deadline": "clients.inside",
    # Every error, as controller exports them (docs/reference/errors.md).
    "ClusterUnavailable": "controller.errors",
    "ColocationError": "controller.errors",
    "NotOwner": "controller.errors",
    "PersistenceError": "controller.errors",
    "PlacementError": "controller.errors",
    "PlacementStringError": "controller.errors",
    "ReservationCancelled": "controller.errors",
    "ReservationConflict": "controller.errors",
    "ReservationDegraded": "controller.errors",
    "ReservationError": "controller.errors",
    "ReservationInfeasible": "controller.errors",
    "ReservationTimeout": "controller.errors",
    "SpecError": "controller.errors",
    "SettingsError": "controller.errors",
    "StaleChange": "controller.errors",
    "StaleReservation": "controller.errors",
    "TableUnreadable": "controller.errors",
    "UndecidedNodes": "controller.errors",
    "UnknownReservation": "controller.errors",
    "ControllerNotFound": "controller.errors",
    "StaleWeights": "clients.weights",  # the weights-version guard's
    "PushTimeout": "clients.weights",
    "PeerLost": "clients.collective",  # a guarded group's member lost
    "RanksLost": "clients.gathering",  # a group call gave up on ranks at the verdict
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'clients' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
