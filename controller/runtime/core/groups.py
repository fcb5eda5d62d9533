"""A reservation's placement groups, through the cluster-I/O interface: create them (paced),
wait for them, probe their devices, check them, and remove them verifiably."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Container, Iterable

import msgspec

from controller.errors import ReservationError, ReservationInfeasible, ReservationTimeout
from controller.planning.cluster import ClusterView
from controller.planning.node_groups import ACCELERATOR
from controller.runtime import core
from controller.runtime.core.demand import Demand
from controller.runtime.core.nodes import ClusterNodes
from controller.runtime.edge import CREATED, REMOVED, ClusterIO, GroupInfo
from controller.state import plan
from controller.state.causes import GROUP_REMOVED, GROUP_UNPLACED, NODE_LOST, NODE_SUSPECTED, Broken
from controller.state.records import ReservationRecord, SlotRecord
from controller.state.wants import for_missing_nodes

log = logging.getLogger("placectl.controller")
PROGRESS_LOG_PERIOD_S = 5.0

Say = Callable[[str], None]


def _why_no_nodes(demand: Demand | None) -> str:
    if demand is None:
        return ""
    refused = demand.refused()
    return f"; {refused}" if refused else "; no autoscaler added the nodes asked for"


async def wait_for_nodes(
    io: ClusterIO,
    nodes: ClusterNodes,
    job: str,
    spec,
    deadline: float,
    say: Say,
    demand: Demand | None = None,
) -> ClusterView:
    """The live cluster once it has the ``spec.num_nodes`` nodes a plan needs. While it
    waits, what is missing is shown to the cluster's autoscaler as pending demand
    (:mod:`controller.state.wants`), withdrawn before it returns or raises.

    Raises:
        ReservationTimeout: still too few at ``deadline``.
    """
    key = f"nodes/{job}"
    last_log = 0.0
    view = nodes.view(spec.accelerator)
    try:
        while view.num_nodes < spec.num_nodes:
            if demand is not None:
                await demand.settle(key)  # a node joined for it: the view below has it
            await nodes.refresh()  # a join the loop has not seen
            view = nodes.view(spec.accelerator)
            if view.num_nodes >= spec.num_nodes:
                break
            message = f"waiting for nodes: {view.num_nodes} of {spec.num_nodes} alive"
            if demand is not None:
                alive = nodes.alive_view(spec.accelerator)
                await demand.want(key, for_missing_nodes(spec, view, alive))
                asked, refused = demand.held(key), demand.refused()
                if asked is not None:
                    message += f"; asked the autoscaler for {asked.describe()}"
                elif refused:
                    message += f"; not asking the autoscaler: {refused}"
            say(message)
            if core.now() - last_log > PROGRESS_LOG_PERIOD_S:
                log.info("%s: %s", job, message)
                last_log = core.now()
            if core.now() >= deadline:
                raise ReservationTimeout(
                    f"reservation {job!r} timed out: the cluster has {view.num_nodes} alive "
                    f"nodes, the configuration needs num_nodes={spec.num_nodes}"
                    + _why_no_nodes(demand)
                )
            await asyncio.sleep(0.5)
    finally:
        if demand is not None and demand.held(key) is not None:
            await asyncio.shield(demand.withdraw(key))
    return view


def refuse_if_it_never_fits(
    nodes: ClusterNodes, what: str, slots: list[SlotRecord], kept: list[SlotRecord] = ()
) -> None:
    """Raise ReservationInfeasible if the slots (with the ``kept`` slots of the same
    reservation) ask a node for more than it has in total: they could never be placed.
    ``what`` names the request in the message."""
    totals = {}
    for slot in slots:
        info = nodes.info(slot.node_id)
        if info is not None and info.alive:
            totals[slot.node_id] = info.resources
    short = plan.shortfalls(slots, totals, kept)
    if short:
        more = f"; and {len(short) - 3} more node(s)" if len(short) > 3 else ""
        raise ReservationInfeasible(
            f"{what} can never be placed: {'; '.join(short[:3])}{more}. Ask for less "
            "(cpus_per_accelerator, a node-level component's CPUs) or place it on nodes "
            "that have it; nothing was changed"
        )


async def diagnose(
    io: ClusterIO,
    slots: list[SlotRecord],
    pending: list[int],
    held_by: Callable[[str], Iterable[str]] = lambda node_id: (),
) -> str:
    """For each pending slot: its node, what it asks for, what the node has free, and
    which reservations hold the rest (``held_by(node_id)``)."""
    free = await io.free_resources()
    parts = []
    for i in pending:
        slot = slots[i]
        need = slot.need()
        have = free.get(slot.node_id)
        wants = ", ".join(f"{k} {v:g}" for k, v in sorted(need.items()))
        if have is None:
            parts.append(f"node {slot.node_rank} ({slot.node_ip}) needs {wants}; the node is dead")
            continue
        frees = ", ".join(f"{k} {have.get(k, 0):g}" for k in sorted(need))
        whose = plan.holders(held_by(slot.node_id))
        parts.append(f"node {slot.node_rank} ({slot.node_ip}) needs {wants}; free {frees}{whose}")
    return "; ".join(parts)


class NodeLost(Exception):
    """A node died while a group pinned to it waited to be placed: it never will be."""

    def __init__(self, nodes: list[str]) -> None:
        super().__init__(f"nodes {', '.join(n[:12] for n in nodes)} died during placement")
        self.nodes = nodes


async def create_and_wait(
    io: ClusterIO,
    job: str,
    slots: list[SlotRecord],
    deadline: float,
    say: Say,
    created: dict[int, str],
    max_in_flight: int = 16,
    held_by: Callable[[str], Iterable[str]] = lambda node_id: (),
    dead: Callable[[str], bool] = lambda node_id: False,
) -> list[SlotRecord]:
    """Create every slot's group and wait until all are placed; the slots with group ids.

    At most ``max_in_flight`` groups wait to be placed at once, so a reservation of
    hundreds of slots does not flood the GCS. ``created`` receives each group's id as
    soon as it exists, so the caller can remove them whatever happens.

    Raises:
        ReservationTimeout: not all placed by ``deadline``; names the pending nodes
            and what they have free.
        NodeLost: the node of a pending group died (``dead``): the caller plans again.
    """
    out = list(slots)
    waits: dict[asyncio.Task, int] = {}
    stuck: list[int] = []  # waits that reached the deadline
    nxt, placed, last_log = 0, 0, 0.0
    try:
        while placed < len(out):
            while nxt < len(out) and len(waits) < max_in_flight and not stuck:
                s = out[nxt]
                making = asyncio.ensure_future(
                    io.create_group(s.group_name, [b.resources for b in s.bundles], s.node_id)
                )
                try:
                    gid = await asyncio.shield(making)
                except asyncio.CancelledError:
                    # The group is being made regardless: learn its id, so it can go.
                    with contextlib.suppress(Exception):
                        created[nxt] = await making
                    raise
                created[nxt] = gid
                out[nxt] = msgspec.structs.replace(s, group_id=gid)
                remaining = max(deadline - core.now(), 0.0)
                waits[asyncio.ensure_future(io.wait_group(gid, remaining))] = nxt
                nxt += 1
            remaining = deadline - core.now()
            if stuck or remaining <= 0:
                pending = sorted(stuck + list(waits.values())) + list(range(nxt, len(out)))
                raise ReservationTimeout(
                    f"reservation {job!r} timed out with {len(pending)} of {len(out)} node "
                    f"slots unplaced: {await diagnose(io, out, pending[:8], held_by)}"
                )
            done, _ = await asyncio.wait(
                waits, timeout=min(1.0, remaining), return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                i = waits.pop(task)
                if task.result():
                    placed += 1
                else:
                    stuck.append(i)
            lost = sorted(
                {out[i].node_id for i in [*waits.values(), *stuck] if dead(out[i].node_id)}
            )
            if lost:
                raise NodeLost(lost)
            if waits and not done:
                pending = sorted(waits.values())
                message = (
                    f"placed {placed} of {len(out)} node slots; waiting for "
                    f"{await diagnose(io, out, pending[:4], held_by)}"
                )
                say(message)
                if core.now() - last_log > PROGRESS_LOG_PERIOD_S:
                    log.info("%s: %s", job, message)
                    last_log = core.now()
            elif len(out) > max_in_flight and done:
                say(f"placed {placed} of {len(out)} node slots")
    finally:
        for task in waits:
            task.cancel()
    return out


async def probe(
    io: ClusterIO, job: str, slots: list[SlotRecord], accelerator: str, deadline: float
) -> list[SlotRecord]:
    """The slots with the physical id (and identity) of every accelerator bundle.

    Serial within a node (one warm worker answers them all), parallel across nodes.
    """

    async def one_slot(slot: SlotRecord) -> SlotRecord:
        bundles = []
        for i, b in enumerate(slot.bundles):
            if b.kind == ACCELERATOR:
                seen = await io.probe(slot.group_id, i, accelerator)
                if len(seen.ids) != 1:
                    raise ReservationError(
                        f"probe in bundle {i} of {slot.group_name} saw {accelerator} ids "
                        f"{seen.ids}; expected exactly one"
                    )
                b = msgspec.structs.replace(
                    b,
                    physical_id=seen.ids[0],
                    uuid=seen.uuids[0] if seen.uuids else "",
                    pci_bus_id=seen.pci_bus_ids[0] if seen.pci_bus_ids else "",
                )
            bundles.append(b)
        return msgspec.structs.replace(slot, bundles=bundles)

    if not slots:
        return []
    remaining = max(deadline - core.now(), 1.0)
    probes = [asyncio.ensure_future(one_slot(s)) for s in slots]
    try:
        _, pending = await asyncio.wait(
            probes, timeout=remaining, return_when=asyncio.FIRST_EXCEPTION
        )
        failed = [t for t in probes if t.done() and not t.cancelled() and t.exception()]
        if failed:
            raise failed[0].exception()
        if pending:
            raise ReservationTimeout(f"reservation {job!r} timed out while probing accelerator ids")
        return [t.result() for t in probes]
    finally:
        for t in probes:
            t.cancel()
        await asyncio.gather(*probes, return_exceptions=True)


def broken_slots(
    res: ReservationRecord,
    groups: dict[str, GroupInfo],
    alive: Container[str],
    suspected: Container[str] = frozenset(),
) -> dict[int, Broken]:
    """The one rule for which slots of a settled reservation are broken, each with its
    cause and why (empty when all is well): its node is not in ``alive`` (the alive node
    ids), or is ``suspected`` (silent to the controller and its witnesses: the slot moves,
    the node is kept), or Ray does not report its group ``CREATED`` (``groups``: Ray's
    entries of its groups). A check records the causes; a repair replaces exactly these
    slots."""
    found = {}
    for i, slot in enumerate(res.slots):
        where = f"slot {i} (node rank {slot.node_rank}, {slot.node_ip})"
        info = groups.get(slot.group_id)
        if slot.node_id not in alive:
            found[i] = Broken(NODE_LOST, f"{where}: node {slot.node_id[:12]} is dead")
        elif slot.node_id in suspected:
            why = f"{where}: node {slot.node_id[:12]} does not answer (suspected)"
            found[i] = Broken(NODE_SUSPECTED, why)
        elif info is None or info.state == REMOVED:
            why = f"{where}: placement group {slot.group_id} was removed"
            found[i] = Broken(GROUP_REMOVED, why)
        elif info.state != CREATED:
            found[i] = Broken(GROUP_UNPLACED, f"{where}: placement group is {info.state}")
    return found


def wandered(res: ReservationRecord, table: dict[str, GroupInfo], lost: Container[int]) -> dict:
    """Of the ``lost`` slots (their node dead), the groups Ray placed again on other
    nodes, by group id, with what they hold on each node (node -> resources). Only a Ray
    that aims groups by a hint (2.48: ``controller.ray_versions.PIN_BY_LABEL``) moves a
    dead node's group; there it holds the room a spare needs."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for i, slot in enumerate(res.slots):
        info = table.get(slot.group_id)
        if i not in lost or info is None or info.state != CREATED:
            continue
        if all(n == slot.node_id for n in info.nodes):
            continue
        held = out.setdefault(slot.group_id, {})
        for node, bundle in zip(info.nodes, slot.bundles, strict=True):
            have = held.setdefault(node, {})
            for k, v in bundle.resources.items():
                have[k] = have.get(k, 0.0) + v
    return out


async def remove_verified(io: ClusterIO, ids: set[str], timeout: float) -> set[str]:
    """Remove groups and wait until Ray reports each one REMOVED (or no longer knows
    it); returns the ids still not gone at the timeout (empty on success)."""
    ids = {i for i in ids if i}
    if not ids:
        return set()
    for gid in sorted(ids):
        try:
            await io.remove_group(gid)
        except Exception as e:  # removal is idempotent; verification decides
            log.info("removing group %s: %s", gid, e)
    deadline = core.now() + timeout
    delay = 0.02
    while True:
        states = await io.groups(sorted(ids))
        left = {g for g in ids if g in states and states[g].state != REMOVED}
        if not left or core.now() >= deadline:
            return left
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)
        for gid in left:  # ask again: a first request may have been lost
            try:
                await io.remove_group(gid)
            except Exception as e:
                log.info("removing group %s: %s", gid, e)


async def ids_by_name(io: ClusterIO, names: set[str], groups: dict | None = None) -> set[str]:
    """Ids of live groups with one of ``names`` (groups created but never recorded)."""
    table = await io.groups() if groups is None else groups
    return {g.group_id for g in table.values() if g.name in names and g.state != REMOVED}
