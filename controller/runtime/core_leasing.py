"""Core leases: a run of a node's CPU units for one engine rank (see
:mod:`controller.state.cores`).

A lease is decided and recorded in one step of the job's steward, from the ledger of
every record and the leases of other jobs' steps in progress (held until their record is
written), with no I/O between choosing the run and holding it: two leases on one node,
of one job or two, never get the same unit.
"""

from __future__ import annotations

from controller.errors import PlacementError, ReservationError
from controller.runtime.context import Context
from controller.runtime.stewards import Trigger
from controller.state.cores import CoreLease, pick_units
from controller.state.owners import Caller
from controller.state.ports import NAMED
from controller.state.records import ReservationRecord


class CoreLeaser:
    """Core leases of every reservation (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self._state, self._nodes = ctx.state, ctx.nodes
        self._stewards = ctx.stewards
        self._records = ctx.records
        self._tentative: dict[str, set[int]] = {}

    async def lease_cores(
        self, job: str, component: str, rank: int, name: str, caller: Caller | None = None
    ) -> CoreLease:
        """Lease, on the node of ``component``'s ``rank``, as many of the node's CPU units
        as the rank's bundles hold, none of them leased to another rank on that node.
        Idempotent by ``name`` for that component and rank.

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

        async def step() -> CoreLease:
            res = self._state.require(job)
            if caller is not None:
                caller.may(res, "a core lease")
            if not res.settled:
                raise ReservationError(f"reservation {job!r} is {res.state}; cores need ready")
            for lease in res.cores:
                if (lease.purpose, lease.component, lease.rank) == (purpose, component, rank):
                    return lease
            lease = await self._choose(res, component, rank, purpose)
            held = self._tentative.setdefault(lease.node_id, set())
            held.update(lease.units())
            try:
                await self._records.cores(res, [*res.cores, lease])
            finally:
                held -= set(lease.units())
                if not held:
                    del self._tentative[lease.node_id]
            return lease

        return await self._stewards.run(job, Trigger.LEASE, step)

    async def _choose(
        self, res: ReservationRecord, component: str, rank: int, purpose: str
    ) -> CoreLease:
        published = await self._state.published(res.job)
        block = published.components.get(component)
        if block is None:
            known = ", ".join(published.components)
            raise PlacementError(f"unknown component {component!r} in {res.job!r}; it has {known}")
        assignments = block.assignments()
        if not 0 <= rank < len(assignments):
            raise PlacementError(
                f"rank {rank} of {component!r}: out of range (0-{len(assignments) - 1})"
            )
        a = assignments[rank]
        node = a.placement.node_id
        slot = next((s for s in res.slots if s.group_id == a.placement_group_id), None)
        info = self._nodes.info(node)
        if slot is None or info is None or not info.alive:
            raise ReservationError(f"the node of {component}:{rank} is gone; repair first")
        bundles = a.bundle_indices or [a.bundle_index]
        count = max(1, round(sum(slot.bundles[b].resources.get("CPU", 0.0) for b in bundles)))
        total = int(info.resources.get("CPU", 0))
        held = self._state.cores_leased(node) | self._tentative.get(node, set())
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
            rank=rank,
            purpose=purpose,
        )
