"""Slot replacement: a reservation whose node died, or whose group vanished, gets that
slot back on a node of the same kind, while its other slots, their groups and their
workers are left alone."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

import msgspec

from controller import groups as groups_io
from controller import raylib
from controller.cluster import ClusterView, NodeView, choose_spare
from controller.ports import MASTER
from controller.reservations import ReservationRecord, SlotRecord

log = logging.getLogger("placectl.controller")
REPAIR_TIMEOUT_S = 10.0  # the target was checked free: placing it should be quick


def broken_slots(res: ReservationRecord, groups: dict, alive: set[str]) -> list[int]:
    """Slots whose node is dead or whose group is gone or not placed."""
    out = []
    for i, slot in enumerate(res.slots):
        info = groups.get(slot.group_id)
        if slot.node_id not in alive or info is None or info["state"] != "CREATED":
            out.append(i)
    return out


def _need(slot: SlotRecord) -> dict[str, float]:
    need: dict[str, float] = {}
    for b in slot.bundles:
        for k, v in b.resources.items():
            need[k] = need.get(k, 0.0) + v
    return need


async def repair(
    res: ReservationRecord,
    group_prefix: str,
    crash_point: Callable[[str], None],
    lease_master: Callable[[ReservationRecord, str], Awaitable[None]],
) -> tuple[ReservationRecord | None, str]:
    """Replace every broken slot of ``res``; returns (the new record, or None; why not).

    The new record has the new slots, the new node in its view, re-leased master ports
    for components whose rank 0 moved, and an epoch one higher; the caller writes it and
    only then may the old groups go. ``res`` itself is never changed, and on failure
    every group made for the attempt is removed.
    """
    groups, alive = await asyncio.to_thread(groups_io.snapshot)
    broken = broken_slots(res, groups, alive)
    if not broken:
        return None, ""
    live = await asyncio.to_thread(raylib.live_view, res.spec.accelerator)
    free = await asyncio.to_thread(raylib.free_resources)
    live_by_id = {n.node_id: n for n in live.nodes}
    taken = {s.node_id for i, s in enumerate(res.slots) if i not in broken}
    targets: dict[int, NodeView] = {}
    for i in broken:
        slot = res.slots[i]
        if slot.node_id in alive and slot.node_id in live_by_id:
            targets[i] = live_by_id[slot.node_id]  # the group went, the node did not
        else:
            spare = choose_spare(
                res.view.nodes[slot.node_rank], live.nodes, free, _need(slot), taken
            )
            if spare is None:
                return None, (
                    f"slot {i} (node rank {slot.node_rank}) lost node {slot.node_ip} "
                    f"({slot.node_id[:12]}); no spare node of the same kind with "
                    + ", ".join(f"{k} {v:g}" for k, v in sorted(_need(slot).items()))
                    + " free; waiting for one to join"
                )
            targets[i] = spare
        taken.add(targets[i].node_id)
    crash_point("replace_after_plan")

    token = secrets.token_hex(3)
    fresh = [
        msgspec.structs.replace(
            res.slots[i],
            node_id=targets[i].node_id,
            node_ip=targets[i].ip,
            group_name=f"{group_prefix}{res.job}:{token}:{i}",
            group_id="",
            bundles=[msgspec.structs.replace(b, physical_id=-1) for b in res.slots[i].bundles],
        )
        for i in broken
    ]
    attempt = msgspec.structs.replace(res, slots=fresh, leases=[])
    handles = groups_io.create(attempt)
    try:
        crash_point("replace_after_create")
        deadline = time.monotonic() + REPAIR_TIMEOUT_S
        await groups_io.wait_ready(attempt, handles, deadline, lambda m: None)
        await groups_io.probe(attempt, deadline)
        crash_point("replace_after_probe")
    except BaseException as e:
        groups_io.remove(attempt)
        if isinstance(e, Exception):
            return None, f"replacing slots {broken} failed, will retry: {e}"
        raise

    old = {i: res.slots[i] for i in broken}
    moved = {old[i].node_id for i in broken if old[i].node_id != targets[i].node_id}
    nodes = list(res.view.nodes)
    slots = list(res.slots)
    for k, i in enumerate(broken):
        nodes[old[i].node_rank] = targets[i]
        slots[i] = attempt.slots[k]
    new = msgspec.structs.replace(
        res,
        view=ClusterView(nodes=nodes),
        slots=slots,
        leases=[x for x in res.leases if x.node_id not in moved],
        epoch=res.epoch + 1,
    )
    try:
        for lease in res.leases:
            if lease.node_id in moved and lease.purpose == MASTER:
                await lease_master(new, lease.component)
    except BaseException as e:
        groups_io.remove(attempt)
        if isinstance(e, Exception):
            return None, f"replacing slots {broken} failed, will retry: {e}"
        raise
    log.warning("reservation %r: replaced slots %s (epoch %d)", res.job, broken, new.epoch)
    return new, ""


def stale_groups(old: list[SlotRecord], res: ReservationRecord) -> set[str]:
    """Group ids of ``old`` slots that ``res`` no longer references."""
    keep = {s.group_id for s in res.slots}
    return {s.group_id for s in old if s.group_id and s.group_id not in keep}
