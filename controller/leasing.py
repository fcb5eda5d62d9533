"""The controller's port-lease methods (a mixin of PlacementController)."""

from __future__ import annotations

import asyncio
from typing import Any

from controller.errors import PlacementError
from controller.ports import MASTER, PortLease, check_request, lease_ports_for
from controller.reservations import DEGRADED, READY, ReservationError, ReservationRecord


class PortLeasing:
    """Master ports and further leases. One lock orders every lease in the cluster;
    the ledger is derived from the leases stored in the table."""

    _ports_lock: asyncio.Lock
    _table: Any

    async def _lease(
        self,
        res: ReservationRecord,
        component: str,
        rank: int,
        count: int,
        consecutive: bool,
        purpose: str,
    ) -> PortLease:
        async with self._ports_lock:
            everyone = [x for r in self._table.reservations.values() for x in r.leases]
            lease = await lease_ports_for(
                res, self._plan(res), everyone, component, rank, count, consecutive, purpose
            )
            res.leases = [*res.leases, lease]
            return lease

    async def lease_ports(
        self,
        job: str,
        component: str,
        rank: int = 0,
        count: int = 1,
        consecutive: bool = True,
        name: str | None = None,
    ) -> list[int]:
        """Lease ``count`` ports on the node of ``component``'s ``rank``.

        Each call returns ports not returned before while they are leased (also under
        concurrent calls), checked free on that node. With ``name``, the call is
        idempotent: the same name returns the same lease. Leases end with the
        reservation or :meth:`release_ports`.
        """
        res = self._get(job)
        count = check_request(count, consecutive)
        if res.state not in (READY, DEGRADED):
            raise ReservationError(f"reservation {job!r} is {res.state}; ports need ready")
        if component not in self._plan(res).components:
            raise PlacementError(f"unknown component {component!r} in {job!r}")
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise PlacementError(f"rank {rank!r}: expected an int")
        purpose = "extra" if name is None else f"name:{name}"
        if name is not None:
            if not isinstance(name, str) or not name:
                raise PlacementError(f"name {name!r}: expected a non-empty string")
            for lease in res.leases:
                if (lease.component, lease.rank, lease.purpose) == (component, rank, purpose):
                    return list(lease.ports)
        lease = await self._lease(res, component, rank, count, consecutive, purpose)
        self._save()
        return list(lease.ports)

    async def release_ports(self, job: str, ports: list[int]) -> int:
        """End the leases holding any of ``ports`` (master ports stay); returns how many."""
        res = self._get(job)
        drop = set(ports) if isinstance(ports, (list, tuple, set)) else set()
        keep = [x for x in res.leases if x.purpose == MASTER or not drop & set(x.ports)]
        ended = len(res.leases) - len(keep)
        if ended:
            res.leases = keep
            self._save()
        return ended
