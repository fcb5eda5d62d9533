"""Ray I/O on a reservation's placement groups: create, wait, probe, check, remove."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import msgspec
import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table

from controller import raylib
from controller.cluster import ClusterView
from controller.node_groups import ACCELERATOR
from controller.reservations import ReservationError, ReservationRecord, ReservationTimeout
from controller.spec import ClusterSpec

log = logging.getLogger("placectl.controller")
PROGRESS_LOG_PERIOD_S = 5.0


def alive_node_ids() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def snapshot() -> tuple[dict, set[str]]:
    """Ray's placement-group table and the alive node ids, read together."""
    return placement_group_table(), alive_node_ids()


def create(res: ReservationRecord) -> list[PlacementGroup]:
    """Create each slot's detached group, bundles pinned to the slot's node; records ids."""
    handles = []
    for slot in res.slots:
        handles.append(
            placement_group(
                [b.resources for b in slot.bundles],
                strategy="PACK",
                name=slot.group_name,
                lifetime="detached",
                bundle_label_selector=[{"ray.io/node-id": slot.node_id}] * len(slot.bundles),
            )
        )
    res.slots = [
        msgspec.structs.replace(s, group_id=h.id.hex())
        for s, h in zip(res.slots, handles, strict=True)
    ]
    return handles


def diagnose(res: ReservationRecord, pending: list[int]) -> str:
    """For each pending slot: its node, what it asks for, and what the node has free."""
    free = raylib.free_resources()
    alive = alive_node_ids()
    parts = []
    for i in pending:
        slot = res.slots[i]
        need: dict[str, float] = {}
        for b in slot.bundles:
            for k, v in b.resources.items():
                need[k] = need.get(k, 0) + v
        have = free.get(slot.node_id, {})
        wants = ", ".join(f"{k} {v:g}" for k, v in sorted(need.items()))
        frees = ", ".join(f"{k} {have.get(k, 0):g}" for k in sorted(need))
        dead = "" if slot.node_id in alive else " (node is dead)"
        parts.append(f"node {slot.node_rank} ({slot.node_ip}){dead} needs {wants}; free {frees}")
    return "; ".join(parts)


async def wait_ready(
    res: ReservationRecord, handles: list, deadline: float, say: Callable[[str], None]
) -> None:
    """Wait until every group is placed; on the deadline raise ReservationTimeout naming
    the pending nodes and their free resources."""
    futures = {asyncio.ensure_future(h.ready()): i for i, h in enumerate(handles)}
    waiting = set(futures)
    last_log = 0.0
    try:
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pending = sorted(futures[f] for f in waiting)
                raise ReservationTimeout(
                    f"reservation {res.job!r} timed out with {len(pending)} of {len(handles)} "
                    f"node slots unplaced: {diagnose(res, pending)}"
                )
            done, waiting = await asyncio.wait(waiting, timeout=min(1.0, remaining))
            for f in done:
                f.result()
            if waiting:
                pending = sorted(futures[f] for f in waiting)
                message = (
                    f"waiting for {len(pending)} of {len(handles)} node slots: "
                    f"{diagnose(res, pending)}"
                )
                say(message)
                if time.monotonic() - last_log > PROGRESS_LOG_PERIOD_S:
                    log.info("%s: %s", res.job, message)
                    last_log = time.monotonic()
    finally:
        for f in waiting:
            f.cancel()


async def probe(res: ReservationRecord, deadline: float) -> None:
    """Record the physical accelerator id of every accelerator bundle.

    Serial within a node (one warm worker answers them all), parallel across nodes.
    """
    accel = res.spec.accelerator

    async def one_slot(slot):
        bundles = []
        for i, b in enumerate(slot.bundles):
            if b.kind == ACCELERATOR:
                ids = await raylib.probe_ref(slot.group_id, i, accel)
                if len(ids) != 1:
                    raise ReservationError(
                        f"probe in bundle {i} of {slot.group_name} saw {accel} ids {ids}; "
                        "expected exactly one"
                    )
                b = msgspec.structs.replace(b, physical_id=ids[0])
            bundles.append(b)
        return msgspec.structs.replace(slot, bundles=bundles)

    remaining = max(deadline - time.monotonic(), 1.0)
    try:
        slots = await asyncio.wait_for(asyncio.gather(*(one_slot(s) for s in res.slots)), remaining)
    except asyncio.TimeoutError:
        raise ReservationTimeout(
            f"reservation {res.job!r} timed out while probing accelerator ids"
        ) from None
    res.slots = list(slots)


def problems(res: ReservationRecord, groups: dict, alive: set[str]) -> list[str]:
    """What is wrong with a settled reservation's slots (empty when all is well)."""
    found = []
    for i, slot in enumerate(res.slots):
        where = f"slot {i} (node rank {slot.node_rank}, {slot.node_ip})"
        info = groups.get(slot.group_id)
        if slot.node_id not in alive:
            found.append(f"{where}: node {slot.node_id[:12]} is dead")
        elif info is None or info["state"] == "REMOVED":
            found.append(f"{where}: placement group {slot.group_id} was removed")
        elif info["state"] != "CREATED":
            found.append(f"{where}: placement group is {info['state']}")
    return found


def remove_ids(ids: set[str], groups: dict) -> None:
    for gid in ids:
        info = groups.get(gid)
        if info is not None and info["state"] == "REMOVED":
            continue
        try:
            ray.util.remove_placement_group(raylib.group_handle(gid))
        except Exception as e:  # already gone: removal is idempotent for us
            log.info("removing group %s: %s", gid, e)


def remove(res: ReservationRecord, groups: dict | None = None) -> None:
    """Remove a reservation's groups, found by id and, for ids never recorded, by name."""
    groups = placement_group_table() if groups is None else groups
    names = {s.group_name for s in res.slots}
    ids = {s.group_id for s in res.slots if s.group_id}
    ids |= {gid for gid, info in groups.items() if info.get("name") in names}
    remove_ids(ids, groups)


async def wait_for_nodes(
    job: str, spec: ClusterSpec, deadline: float, say: Callable[[str], None]
) -> ClusterView:
    """The live cluster once it has ``spec.num_nodes`` alive nodes; ReservationTimeout
    at the deadline."""
    last_log = 0.0
    while True:
        view = raylib.live_view(spec.accelerator)
        if view.num_nodes >= spec.num_nodes:
            return view
        message = f"waiting for nodes: {view.num_nodes} of {spec.num_nodes} alive"
        say(message)
        if time.monotonic() - last_log > PROGRESS_LOG_PERIOD_S:
            log.info("%s: %s", job, message)
            last_log = time.monotonic()
        if time.monotonic() >= deadline:
            raise ReservationTimeout(
                f"reservation {job!r} timed out: the cluster has {view.num_nodes} alive "
                f"nodes, the configuration needs num_nodes={spec.num_nodes}"
            )
        await asyncio.sleep(0.5)


def recover(table, prefix: str) -> None:
    """Bring a freshly loaded table in line with Ray, as the controller's contract says:
    roll back reservations cut short while pending or releasing, mark the others ready or
    degraded, and remove orphaned groups (``prefix`` names, referenced by no record)."""
    from controller.reservations import DEGRADED, PENDING, READY, RELEASING

    groups = placement_group_table()
    alive = alive_node_ids()
    keep: set[str] = set()
    for job, res in list(table.reservations.items()):
        if res.state in (PENDING, RELEASING):
            log.warning("rolling back %s reservation %r cut short by a restart", res.state, job)
            remove(res, groups)
            del table.reservations[job]
            continue
        found = problems(res, groups, alive)
        res.state, res.reason = (DEGRADED, "; ".join(found)) if found else (READY, "")
        keep |= {s.group_id for s in res.slots}
    orphans = {
        gid
        for gid, info in groups.items()
        if (info.get("name") or "").startswith(prefix)
        and info["state"] != "REMOVED"
        and gid not in keep
    }
    if orphans:
        log.warning("removing %d orphaned placement groups: %s", len(orphans), sorted(orphans))
        remove_ids(orphans, groups)
