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
``os.environ`` exactly (a key its own assignment set that the rank's does not, such as
an ``env_configs`` variable of the node it shadowed, is removed), removes
``PLACECTL_STANDBY``, calls the class's ``on_promote(env)`` if
it has one, and the standby is the rank from then on: no process starts.

A detached standby is named after its bundle (:func:`standby_name`), so a restarted
driver finds it from the assignments alone. Whether it was promoted is recorded in the
GCS by the standby itself as it is promoted (:func:`promoted_as`): a driver that died
between the controller making the spare a slot and the promotion leaves a standby that
the next driver attaches as a standby, not as the rank, and ``repair()`` promotes.

**One promotion per standby.** Promotion runs inside the standby, one call at a time,
and checks what it was promoted to before (:func:`promote_here`): promoted again to the
same rank at the same epoch it changes nothing (two drivers of one detached group both
promoting); to the same rank at a newer epoch it takes the newer environment; to an
older epoch, or to another rank, it refuses and says so, so a driver with an older view
never undoes a newer promotion.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import ray

from clients.launching import WORKER_NAMESPACE, detached_worker, worker_name
from clients.ray_state import actor_entry, gcs
from controller import PlacementError
from controller.state.assignments import Assignment
from controller.state.standbys import STANDBY
from controller.surface import new_tag

Key = tuple[str, int]  # (placement group id, bundle index)

# In the standby once promoted: "<epoch>:<rank>" it was promoted to.
PROMOTED = "PLACECTL_PROMOTED"
# What a promotion did: became the rank; was that rank already (at this epoch, or an
# older one: now at this one); is that rank at a newer epoch (left as it is); is
# another rank (refused).
BECAME, AGAIN, NEWER, TAKEN = "became", "again", "newer", "taken"
_KV_PREFIX = b"promoted/"

# What status says of a standby, from Ray's actor table under the standby's name.
READY, STARTING, MISSING = "ready", "starting", "missing"
_STARTING = {"PENDING_CREATION", "DEPENDENCIES_UNREADY", "RESTARTING"}


def key_of(a: Assignment) -> Key:
    return (a.placement_group_id, a.bundle_index)


def held_groups(reservation: Any) -> set[str]:
    """The placement groups of the spares ``reservation`` holds now (one GCS read)."""
    return {s.group_id for s in reservation.controller.record(reservation.job).spares}


def standbys_to_come(reservation: Any, component: str) -> str | None:
    """What to say when ``component`` has standbys but the reservation holds fewer
    spares than it asked for yet (the controller holds them as nodes free up), else
    None."""
    if not reservation.spec.component(component).standby:
        return None
    wanted, held = reservation.spec.spares, len(held_groups(reservation))
    if held >= wanted:
        return None
    return (
        f"{reservation.job}/{component}: standbys start on {held} of {wanted} spare "
        "node(s) held so far; the rest start once held, at repair() or refill_standbys()"
    )


def standby_name(job: str, component: str, a: Assignment) -> str:
    """The name of a detached standby in the bundle of ``a`` (namespace
    ``placectl-workers``); a promoted one keeps it."""
    return f"{job}.{component}~{a.placement_group_id}.{a.bundle_index}"


def end_other_standbys(reservation: Any, component: str, taken: list[Assignment]) -> list[str]:
    """End the detached standbys of ``reservation``'s other components in the bundles of
    ``taken`` (the assignments ``component``'s ranks are about to start in): a repair that
    took a held spare of another kind finds that kind's standbys holding its devices,
    and their own group would end them only at its next refill, which a driver blocked
    in this repair never reaches. Their group drops them at that refill (the spare is a
    slot now). Returns the names of those ended."""
    others = [
        c
        for c in reservation.components
        if c != component and reservation.spec.component(c).standby
    ]
    ended = []
    for c in others:
        # A component colocated with this one shares its bundles: its standby there is
        # its own rank's, promoted by its own repair. Only a bundle that none of its
        # ranks has is another kind's spare taken.
        theirs = {key_of(x) for x in reservation.assignments(c, allow_degraded=True)}
        for a in taken:
            if key_of(a) in theirs:
                continue
            name = standby_name(reservation.job, c, a)
            with contextlib.suppress(ValueError):  # none there by that name
                ray.kill(ray.get_actor(name, namespace=WORKER_NAMESPACE), no_restart=True)
                ended.append(name)
    return ended


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
            entry = actor_entry(actor)
            state = entry.get("State")
            said = READY if state == "ALIVE" else STARTING if state in _STARTING else MISSING
            rows.append((a, said))
    return out


def promoted_as(name: str) -> str | None:
    """What the detached standby ``name`` was promoted to (``"<epoch>:<rank>"``), or
    None while it is a standby (one GCS read)."""
    got = gcs().internal_kv_get(_KV_PREFIX + name.encode(), WORKER_NAMESPACE.encode())
    return None if got is None else got.decode()


def forget_promotion(name: str) -> None:
    """The promoted standby ``name`` is gone: its record goes too."""
    with contextlib.suppress(Exception):
        gcs().internal_kv_del(_KV_PREFIX + name.encode(), False, WORKER_NAMESPACE.encode())


def promote_here(
    instance: Any, env: dict[str, str], name: str | None = None, drop: tuple[str, ...] = ()
) -> tuple[int, str]:
    """Run inside the standby (``__ray_call__``): become the rank of ``env``, without
    the keys ``drop`` (its own assignment's that the rank's has not). Returns the
    process id, which is the rank's from now on, and what was done (:data:`BECAME`,
    :data:`AGAIN`, :data:`NEWER` or :data:`TAKEN`, see the module docstring). A detached
    standby (``name``) records its promotion in the GCS before it returns."""
    rank, epoch = env.get("RANK", ""), int(env.get("PLACECTL_EPOCH") or 0)
    was = os.environ.get(PROMOTED)
    if was is not None:
        old_epoch, old_rank = was.split(":", 1)
        if old_rank != rank:
            return os.getpid(), TAKEN
        if epoch < int(old_epoch):
            return os.getpid(), NEWER
    for key in drop:
        os.environ.pop(key, None)
    os.environ.update(env)
    os.environ.pop(STANDBY, None)
    os.environ[PROMOTED] = f"{epoch}:{rank}"
    if name:
        key = _KV_PREFIX + name.encode()
        gcs().internal_kv_put(key, os.environ[PROMOTED].encode(), True, WORKER_NAMESPACE.encode())
    if was is not None:
        return os.getpid(), AGAIN
    hook = getattr(instance, "on_promote", None)
    if callable(hook):
        hook(dict(env))
    return os.getpid(), BECAME


def find_ranks(
    reservation: Any, component: str, assignments: list[Assignment], worker_cls: Any
) -> tuple[list, list, list[tuple[Assignment, Any, str]]]:
    """The running detached workers of ``assignments`` (rank order) for
    ``WorkerGroup.attach``: each rank's actor and name (None where there is none), and
    the unpromoted standbys found in ranks' bundles, ``(assignment, actor, name)``: the
    controller made their held spare the rank's slot, and the driver that would have
    promoted them died first. They are standbys, not ranks; ``repair()`` promotes them.
    Without ``worker_cls`` a missing rank, or one only a standby holds, is an error."""
    actors, names, standing = [], [], []
    named = {
        n["name"]
        for n in ray.util.list_named_actors(all_namespaces=True)
        if n["namespace"] == WORKER_NAMESPACE
    }
    for a in assignments:
        base = worker_name(reservation.job, component, a.placement.rank)
        spare = standby_name(reservation.job, component, a)
        found = _rank_process(base, spare, a, named)
        # None on the rank's node: a relaunch's at this epoch, the rank's own wherever
        # it runs (repair() moves it), a standby in the rank's bundle.
        for name in (f"{base}@{a.epoch}", base, spare):
            if found is not None:
                break
            with contextlib.suppress(PlacementError):
                found = (detached_worker(name), name)
        if found is not None and found[1] == spare and promoted_as(spare) is None:
            if worker_cls is None:
                raise PlacementError(
                    f"{reservation.job}/{component} rank {a.placement.rank}: its slot "
                    f"moved to a held spare while no driver ran, and the standby there "
                    f"({spare!r}) is not promoted yet; attach with the worker class (and "
                    "its arguments), then repair() promotes it"
                )
            standing.append((a, found[0], spare))
            found = None
        if found is None and worker_cls is None:
            detached_worker(base)  # raises, naming the missing worker
        actors.append(found[0] if found else None)
        names.append(found[1] if found else None)
    return actors, names, standing


_LIVE = {"ALIVE", *_STARTING}


def _rank_process(base: str, spare: str, a: Assignment, named: set[str]) -> tuple[Any, str] | None:
    """The live process of the rank of ``a`` among the workers ``named`` on the node its
    assignment puts it (or not placed yet): a relaunch's (``base@<epoch>``, started while
    the old process was on a node away; the newest first), the rank's own name
    (``base``), or the standby in its bundle (``spare``). Before a process left on a node
    the rank moved off, which, attached, would be served the work the rank's new process
    should have, while ``repair()`` started a second one."""

    def epoch(name: str) -> int:
        tail = name.rpartition("@")[2]
        return int(tail) if "@" in name and tail.isdigit() else -1

    relaunches = sorted((n for n in named if n.startswith(base + "@")), key=epoch)
    for name in [*reversed(relaunches), base, spare]:
        if name not in named:
            continue
        try:
            actor = detached_worker(name)
        except PlacementError:
            continue
        entry = actor_entry(actor)
        node = entry.get("Address", {}).get("NodeID", "")
        if entry.get("State") in _LIVE and node in ("", "0" * len(node), a.placement.node_id):
            return actor, name
    return None


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
                self.adopt(a, ray.get_actor(name, namespace=WORKER_NAMESPACE), name)

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

    def dead(self, is_dead) -> list[Key]:
        """The standbys ``is_dead(actor)`` says are dead (crashed, or their node lost),
        forgotten: a new one is started in each bundle still held."""
        gone = [key for key, (actor, *_) in self.running.items() if is_dead(actor)]
        for key in gone:
            del self.running[key]
        return gone

    def adopt(self, a: Assignment, actor: Any, name: str) -> None:
        """Keep the detached standby ``name`` found in the bundle of ``a`` (its tag
        follows from its name, as :mod:`clients.roster` made it)."""
        self.running[key_of(a)] = (actor, a, name, new_tag(a.uid, name, True))

    def take(self, fresh: Assignment) -> tuple[Any, Assignment, str | None, str] | None:
        """The standby in the bundle of ``fresh`` (removed from the standbys): its actor,
        its own assignment, name and tag; or None."""
        return self.running.pop(key_of(fresh), None)
