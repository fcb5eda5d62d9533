"""Leases: master ports for every component, ports leased on request, and the CPU units
engine ranks bind (:mod:`controller.state.leases`).

A lease is decided in three steps: choose a window of candidate ports that no lease and
no lease in progress holds (under one short lock, no I/O), ask the node which of them
are free (outside the lock, with a deadline), then record the lease (in a step of the
job's steward, written before it is returned). Ports of a lease in progress are held
tentatively, so two leases on one node never get the same port, and one unresponsive
node never stalls leases anywhere else.
"""

from __future__ import annotations

import asyncio
import zlib

import msgspec

from controller.errors import PlacementError, ReservationError
from controller.runtime.core.context import Context
from controller.runtime.core.stewards import Trigger
from controller.state.change import Caller
from controller.state.leases import (
    MASTER,
    NAMED,
    REQUEST,
    CoreLease,
    PortLease,
    candidates,
    check_request,
    check_standby,
    lease_purpose,
    pick_run,
    pick_units,
)
from controller.state.plan import JobPlan
from controller.state.records import ReservationRecord, SlotRecord
from controller.state.standbys import standby_at

MAX_WINDOWS = 8
Hold = tuple[str, set[int]]


def _same_holder(lease, component: str, rank: int, standby: tuple[str, int] | None) -> bool:
    """Whether ``lease`` was made for this rank, or for this standby."""
    if standby is not None:
        return (lease.component, lease.standby) == (component, standby)
    return lease.standby is None and (lease.component, lease.rank) == (component, rank)


def _slot_of(
    res: ReservationRecord,
    plan: JobPlan,
    component: str,
    rank: int,
    standby: tuple[str, int] | None,
) -> tuple[SlotRecord, str]:
    """The slot (or held spare) whose node a lease is made on, and that node in words.

    Raises:
        PlacementError: a rank out of range, or no standby of ``component`` in that
            bundle of a held spare (the message lists those there are).
    """
    if standby is not None:
        if standby_at(res, plan, component, standby) is None:
            held = [f"{s.group_id}:{len(s.bundles)} bundle(s)" for s in res.spares] or ["none"]
            raise PlacementError(
                f"standby {list(standby)} of {component!r}: no standby of it in that bundle "
                f"of a held spare of {res.job!r} (held spares: {', '.join(held)})"
            )
        spare = next(s for s in res.spares if s.group_id == standby[0])
        return spare, f"held spare node ({spare.node_ip})"
    placements = plan.component(component).placements
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(placements):
        raise PlacementError(
            f"rank {rank!r} of {component!r}: out of range (0-{len(placements) - 1})"
        )
    node_rank = placements[rank].node_rank
    slot = next(s for s in res.slots if s.node_rank == node_rank)
    return slot, f"node {node_rank} ({slot.node_ip})"


class Tentative:
    """Numbers (ports, CPU units) of leases in progress, by node: held from the moment
    they are chosen until the lease is recorded or abandoned."""

    def __init__(self) -> None:
        self._by_node: dict[str, set[int]] = {}

    def of(self, node_id: str) -> set[int]:
        return set(self._by_node.get(node_id, ()))

    def hold(self, node_id: str, numbers) -> None:
        self._by_node.setdefault(node_id, set()).update(numbers)

    def drop(self, node_id: str, numbers) -> None:
        held = self._by_node.get(node_id)
        if held is not None:
            held -= set(numbers)
            if not held:
                del self._by_node[node_id]


class Leaser:
    """Master ports and further leases (see the module docstring). It keeps to itself the
    ports of leases in progress; the leases themselves are in the records."""

    def __init__(self, ctx: Context) -> None:
        self._io, self._state = ctx.io, ctx.state
        self._stewards = ctx.stewards
        self._records = ctx.records
        self.settings = ctx.settings
        self._tentative = Tentative()

    def _held(self, node_id: str) -> set[int]:
        """Ports leased on a node (the records' ledger) or held by a lease in progress."""
        held = self._state.ports_leased(node_id)
        held.update(self._tentative.of(node_id))
        return held

    def drop_holds(self, holds: list[Hold]) -> None:
        """Let go of the ports of leases now recorded (or abandoned)."""
        for node_id, ports in holds:
            self._tentative.drop(node_id, ports)
        holds.clear()

    async def _find_ports(
        self,
        res: ReservationRecord,
        plan: JobPlan,
        component: str,
        rank: int,
        count: int,
        consecutive: bool,
        purpose: str,
        holds: list[Hold],
        standby: tuple[str, int] | None = None,
    ) -> PortLease:
        """Ports on the node of ``component``'s ``rank`` (or of the held spare's bundle
        ``standby``) that no lease holds and that nothing on the node has bound. They
        stay held (``holds``) until the caller has recorded the lease and drops the hold."""
        slot, where = _slot_of(res, plan, component, rank, standby)
        node = slot.node_id
        low, high = res.spec.ports.low, res.spec.ports.high
        # Where the search starts: its own place per rank and per standby, so that
        # processes on nodes that share an address (a local test cluster) rarely meet.
        holder = f"{rank}" if standby is None else f"{standby[0]}.{standby[1]}"
        start = zlib.crc32(f"{res.job}/{component}/{holder}".encode())
        width = max(4 * count, 256)
        tried: set[int] = set()
        for _ in range(MAX_WINDOWS):
            # No await between choosing the window and holding it: no other lease of
            # the node can choose the same ports meanwhile, without a lock.
            window = candidates(low, high, self._held(node) | tried, start)[:width]
            if len(window) < count:
                break
            self._tentative.hold(node, window)
            try:
                free = await asyncio.wait_for(
                    self._io.free_ports(node, window), self.settings.port_check_timeout
                )
            except asyncio.TimeoutError:
                self._tentative.drop(node, set(window))
                raise ReservationError(
                    f"{where} did not answer the port check within "
                    f"{self.settings.port_check_timeout:g}s; no port was leased"
                ) from None
            except BaseException:
                self._tentative.drop(node, set(window))
                raise
            run = pick_run(free, count, consecutive)
            self._tentative.drop(node, set(window) - set(run))
            if run:
                holds.append((node, set(run)))
                return PortLease(
                    node_id=node,
                    node_ip=slot.node_ip,
                    ports=run,
                    component=component,
                    rank=-1 if standby else rank,
                    purpose=purpose,
                    standby=standby,
                )
            tried.update(window)
            start = window[-1] + 1 - low
        kind = " consecutive" if consecutive else ""
        raise ReservationError(
            f"no {count}{kind} free port(s) in cluster.ports {low}-{high} on {where}: "
            f"placectl leases {len(self._held(node))} there, the rest are "
            "bound or inside the node's ephemeral port range"
        )

    async def lease_masters(
        self,
        res: ReservationRecord,
        plan: JobPlan,
        holds: list[Hold],
        components: list[str] | None = None,
    ) -> ReservationRecord:
        """``res`` with a master-port lease for rank 0 of each component (all of them, or
        ``components``), replacing any master lease those components had."""
        names = plan.names if components is None else components
        leases = [x for x in res.leases if not (x.purpose == MASTER and x.component in names)]
        for name in names:
            leases.append(await self._find_ports(res, plan, name, 0, 1, False, MASTER, holds))
        return msgspec.structs.replace(res, leases=leases)

    async def lease_ports(
        self,
        job: str,
        component: str,
        rank: int = 0,
        count: int = 1,
        consecutive: bool = True,
        name: str | None = None,
        request_id: str | None = None,
        caller: Caller | None = None,
        standby: tuple[str, int] | None = None,
    ) -> list[int]:
        """Lease ``count`` ports on the node of ``component``'s ``rank``, or, with
        ``standby`` (a held spare's placement group id and bundle index), for the standby
        of ``component`` there: a repair that makes the spare a slot hands it to the rank
        then in that bundle (:func:`controller.state.standbys.settle_standby_leases`).

        Each call returns ports no other lease holds (also under concurrent calls),
        checked free on that node and outside its ephemeral range. The call is idempotent:
        the same ``name`` (for that component and rank), or the same ``request_id``
        (clients send a fresh one per call, so Ray's retries after a controller crash
        find the lease they made), returns the same lease. Leases end with the
        reservation or :meth:`release_ports`.
        """
        self._state.require(job)
        count = check_request(count, consecutive)
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise PlacementError(f"rank {rank!r}: expected an int")
        purpose = lease_purpose(name, request_id)
        standby = check_standby(standby)

        async def step() -> list[int]:
            res = self._state.require(job)
            if caller is not None:
                caller.may(res, "a port lease")
            if not res.settled:
                raise ReservationError(f"reservation {job!r} is {res.state}; ports need ready")
            plan = (await self._state.plan(job)).plan
            if component not in plan.names:
                raise PlacementError(
                    f"unknown component {component!r} in {job!r}; it has {', '.join(plan.names)}"
                )
            for lease in res.leases:
                same = purpose.startswith(REQUEST) or _same_holder(lease, component, rank, standby)
                if lease.purpose == purpose and same:
                    return list(lease.ports)
            holds: list[Hold] = []
            try:
                lease = await self._find_ports(
                    res, plan, component, rank, count, consecutive, purpose, holds, standby
                )
                await self._records.leases(res, [*res.leases, lease])
            finally:
                self.drop_holds(holds)
            return list(lease.ports)

        return await self._stewards.run(job, Trigger.LEASE, step)

    async def release_ports(self, job: str, ports: list[int], caller: Caller | None = None) -> int:
        """End the leases holding any of ``ports`` (master ports stay); returns how many."""
        self._state.require(job)
        if not isinstance(ports, (list, tuple, set)) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in ports
        ):
            raise PlacementError(f"ports {ports!r}: expected a list of ints")

        async def step() -> int:
            res = self._state.require(job)
            if caller is not None:
                caller.may(res, "a port release")
            drop = set(ports)
            keep = [x for x in res.leases if x.purpose == MASTER or not drop & set(x.ports)]
            ended = len(res.leases) - len(keep)
            if ended:
                await self._records.leases(res, keep)
            return ended

        return await self._stewards.run(job, Trigger.RETURN_PORTS, step)


class CoreLeaser:
    """Core leases of every reservation (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self._state, self._nodes = ctx.state, ctx.nodes
        self._stewards = ctx.stewards
        self._records = ctx.records
        self._tentative = Tentative()

    async def lease_cores(
        self,
        job: str,
        component: str,
        rank: int,
        name: str,
        caller: Caller | None = None,
        standby: tuple[str, int] | None = None,
    ) -> CoreLease:
        """Lease, on the node of ``component``'s ``rank``, as many of the node's CPU units
        as the rank's bundles hold, none of them leased to another rank on that node.
        Idempotent by ``name`` for that component and rank. With ``standby`` (a held
        spare's bundle), for the standby of ``component`` there, as for ports.

        Raises:
            PlacementError: an unknown component, a rank out of range, or a bad name.
            ReservationError: the reservation is not ready, its node is gone, or the
                node has no such free run (the message counts what is leased there).
        """
        self._state.require(job)
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise PlacementError(f"rank {rank!r}: expected an int")
        if not isinstance(name, str) or not 0 < len(name) <= 128:
            raise PlacementError(f"name {name!r}: expected a non-empty string of <= 128 chars")
        purpose = NAMED + name
        standby = check_standby(standby)

        async def step() -> CoreLease:
            res = self._state.require(job)
            if caller is not None:
                caller.may(res, "a core lease")
            if not res.settled:
                raise ReservationError(f"reservation {job!r} is {res.state}; cores need ready")
            for lease in res.cores:
                if lease.purpose == purpose and _same_holder(lease, component, rank, standby):
                    return lease
            lease = await self._choose(res, component, rank, purpose, standby)
            self._tentative.hold(lease.node_id, lease.units())
            try:
                await self._records.cores(res, [*res.cores, lease])
            finally:
                self._tentative.drop(lease.node_id, lease.units())
            return lease

        return await self._stewards.run(job, Trigger.LEASE, step)

    async def _choose(
        self,
        res: ReservationRecord,
        component: str,
        rank: int,
        purpose: str,
        standby: tuple[str, int] | None,
    ) -> CoreLease:
        published = await self._state.published(res.job)
        block = published.components.get(component)
        if block is None:
            known = ", ".join(published.components)
            raise PlacementError(f"unknown component {component!r} in {res.job!r}; it has {known}")
        if standby is not None:
            plan = (await self._state.plan(res.job)).plan
            slot, _ = _slot_of(res, plan, component, -1, standby)  # checks there is one
            a = standby_at(res, plan, component, standby)
        else:
            assignments = block.assignments()
            if not 0 <= rank < len(assignments):
                raise PlacementError(
                    f"rank {rank} of {component!r}: out of range (0-{len(assignments) - 1})"
                )
            a = assignments[rank]
            slot = next((s for s in res.slots if s.group_id == a.placement_group_id), None)
        node = a.placement.node_id
        info = self._nodes.info(node)
        if slot is None or info is None or not info.alive:
            raise ReservationError(f"the node of {component}:{rank} is gone; repair first")
        bundles = a.bundle_indices or [a.bundle_index]
        count = max(1, round(sum(slot.bundles[b].resources.get("CPU", 0.0) for b in bundles)))
        total = int(info.resources.get("CPU", 0))
        held = self._state.cores_leased(node) | self._tentative.of(node)
        first = pick_units(held, total, count)
        if first is None:
            raise ReservationError(
                f"no {count} free CPU unit(s) in a run on node {a.placement.node_rank} "
                f"({a.placement.node_ip}) for {component}:{rank}: {len(held)} of its {total} "
                "are leased to engine ranks there"
            )
        return CoreLease(
            node_id=node,
            first=first,
            count=count,
            node_cpus=total,
            component=component,
            rank=-1 if standby else rank,
            purpose=purpose,
            standby=standby,
        )
