"""Inside a placed process: its own assignment, as of now."""

from __future__ import annotations

import os

from controller import PlacementError
from controller.errors import StaleReservation
from controller.state.assignments import Assignment

# (controller, job, component, rank) -> (the record's uid and epoch, the rank's assignment)
_CURRENT: dict[tuple, tuple[tuple[str, int], Assignment]] = {}


def placed() -> tuple[str, str, int, str]:
    """This process's job, component, rank and controller name, from the environment
    placectl gave it.

    Raises:
        PlacementError: the process was not placed by placectl.
    """
    env = os.environ
    missing = [k for k in ("PLACECTL_JOB", "PLACECTL_COMPONENT", "RANK") if k not in env]
    if missing:
        raise PlacementError(
            f"not a placectl worker: {', '.join(missing)} not set in the environment"
        )
    name = env.get("PLACECTL_CONTROLLER", "placectl")
    return env["PLACECTL_JOB"], env["PLACECTL_COMPONENT"], int(env["RANK"]), name


def current(strict: bool = False) -> Assignment:
    """Inside a worker placectl placed: its own :class:`Assignment`, as of now.

    Reads the reservation's record (one GCS read) on every call, so it never serves an
    assignment of an identity or epoch that is gone: after a repair or a
    ``replace=True`` it returns the rank's new assignment.

    Args:
        strict: raise :class:`StaleReservation` when this rank's assignment is no
            longer the one the process was started with: another reservation, or an
            epoch that changed this rank. A change elsewhere in the job (a repair of
            another node, an ``apply`` that left this rank alone) keeps a rank's
            assignment, epoch included.

    Raises:
        PlacementError: the process was not placed by placectl, or its rank is gone.
    """
    from clients.reservation import Reservation
    from clients.session import Controller

    env = os.environ
    job, component, rank, name = placed()
    ctl = Controller(None, name)
    record = ctl.record(job)
    key = (name, job, component, rank)
    cached = _CURRENT.get(key)
    if cached is None or cached[0] != (record.uid, record.epoch):
        items = (
            Reservation(ctl, record).assignments(component, allow_degraded=True)
            if component in record.world_sizes
            else []
        )
        if rank >= len(items):
            raise StaleReservation(
                f"{job} (uid {record.uid}, epoch {record.epoch}) has no rank {rank} of "
                f"{component!r} any more"
            )
        _CURRENT[key] = ((record.uid, record.epoch), items[rank])
    now = _CURRENT[key][1]
    mine = (env.get("PLACECTL_UID", ""), env.get("PLACECTL_EPOCH", ""))
    if strict and mine != (now.uid, str(now.epoch)):
        raise StaleReservation(
            f"{job}/{component}:{rank} was started with its assignment of reservation "
            f"{mine[0]} epoch {mine[1]}; it is now reservation {now.uid} epoch {now.epoch}"
        )
    return now


def preempt_deadline() -> float | None:
    """Inside a worker placectl placed: when its reservation, being preempted for one of
    higher priority, is released (wall-clock seconds), or None when it is not being
    preempted. One GCS read; a worker that checkpoints on it loses nothing."""
    from clients.session import Controller

    env = os.environ
    if "PLACECTL_JOB" not in env:
        raise PlacementError("not a placectl worker: PLACECTL_JOB not set in the environment")
    ctl = Controller(None, env.get("PLACECTL_CONTROLLER", "placectl"))
    return ctl.record(env["PLACECTL_JOB"]).preempt_at or None
