"""Standby processes of one worker group: started on the reservation's held spares
(``cluster.spares``) for a component with ``standby: true``, built like its ranks but no
rank, and promoted in place of a rank a lost node took.

A standby starts with the devices and node-local environment of its bundle on the held
spare, without the job-wide identity (``RANK``, ``WORLD_SIZE``, ``NODE_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) and with ``PLACECTL_STANDBY=1``: its constructor may
load a model and warm up, but a collective formed from its environment fails instead of
joining as another rank. Nothing sends it work.

When a repair makes the held spare a lost node's slot, the group and its bundle indices
stay, so the lost rank's new assignment names the standby's ``(placement group,
bundle)``. Promotion then writes that rank's environment into the standby's
``os.environ``, removes ``PLACECTL_STANDBY``, calls the class's ``on_promote(env)`` if
it has one, and the standby is the rank from then on: no process starts.

A detached standby is named after its bundle (:func:`standby_name`), so a restarted
driver finds it, promoted or not, from the assignments alone.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import ray

from clients.launching import WORKER_NAMESPACE
from controller.state.assignments import Assignment
from controller.state.spares import STANDBY
from controller.surface import new_tag

Key = tuple[str, int]  # (placement group id, bundle index)

# What status says of a standby, from Ray's actor table under the standby's name.
READY, STARTING, MISSING = "ready", "starting", "missing"
_STARTING = {"PENDING_CREATION", "DEPENDENCIES_UNREADY", "RESTARTING"}


def key_of(a: Assignment) -> Key:
    return (a.placement_group_id, a.bundle_index)


def held_groups(reservation: Any) -> set[str]:
    """The placement groups of the spares ``reservation`` holds now (one GCS read)."""
    return {s.group_id for s in reservation.controller.record(reservation.job).spares}


def standby_name(job: str, component: str, a: Assignment) -> str:
    """The name of a detached standby in the bundle of ``a`` (namespace
    ``placectl-workers``); a promoted one keeps it."""
    return f"{job}.{component}~{a.placement_group_id}.{a.bundle_index}"


def standby_states(reservation: Any) -> dict[str, list[tuple[Assignment, str]]]:
    """For each component with ``standby: true``, each standby it should have on the held
    spares and what Ray's actor table says of the one by that name: ``ready`` (its
    process runs), ``starting`` (created, not running yet, or restarting) or ``missing``
    (none by that name, or dead). Read from Ray, so another driver's standbys count."""
    out: dict[str, list[tuple[Assignment, str]]] = {}
    for component in reservation.components:
        if not reservation.spec.component(component).standby:
            continue
        rows = out.setdefault(component, [])
        for a in reservation.standbys(component):
            try:
                name = standby_name(reservation.job, component, a)
                actor = ray.get_actor(name, namespace=WORKER_NAMESPACE)
            except ValueError:
                rows.append((a, MISSING))
                continue
            entry = ray._private.state.state.actor_table(actor._actor_id.hex()) or {}
            state = entry.get("State")
            said = READY if state == "ALIVE" else STARTING if state in _STARTING else MISSING
            rows.append((a, said))
    return out


def promote_here(instance: Any, env: dict[str, str]) -> int:
    """Run inside the standby (``__ray_call__``): become the rank of ``env``. Returns
    the process id, which is the rank's from now on."""
    os.environ.update(env)
    os.environ.pop(STANDBY, None)
    hook = getattr(instance, "on_promote", None)
    if callable(hook):
        hook(dict(env))
    return os.getpid()


class Standbys:
    """The standby processes of one group, by the bundle each runs in.

    Each entry is ``(actor, assignment, name, tag)`` as :meth:`clients.roster.Roster.start`
    returns them, the assignment being the standby's own."""

    def __init__(self) -> None:
        self.running: dict[Key, tuple[Any, Assignment, str | None, str]] = {}

    def __len__(self) -> int:
        return len(self.running)

    def find(self, job: str, component: str, wanted: list[Assignment]) -> None:
        """Attach the detached standbys of ``wanted`` that run (a restarted driver)."""
        for a in wanted:
            name = standby_name(job, component, a)
            with contextlib.suppress(ValueError):
                actor = ray.get_actor(name, namespace=WORKER_NAMESPACE)
                # A detached worker's tag follows from its name (clients.roster).
                self.running[key_of(a)] = (actor, a, name, new_tag(a.uid, name, True))

    def drop(self, keep: set[Key]) -> list[tuple[Assignment, str]]:
        """Kill the standbys not in ``keep``; their assignments and tags, for the
        caller to end what they left on their nodes."""
        dropped = []
        for key in [k for k in self.running if k not in keep]:
            actor, a, _, tag = self.running.pop(key)
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            dropped.append((a, tag))
        return dropped

    def take(self, fresh: Assignment) -> tuple[Any, str | None, str] | None:
        """The standby in the bundle of ``fresh`` (removed from the standbys), or None."""
        found = self.running.pop(key_of(fresh), None)
        return None if found is None else (found[0], found[2], found[3])
