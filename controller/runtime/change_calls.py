"""The controller's calls that change a live reservation: ``apply``, ``resize``,
``repair`` and port leases, each refused to a caller without the reservation's owner
token unless forced (:mod:`controller.state.owners`). Part of
:class:`~controller.runtime.controller.PlacementController` (a mixin, so that the facade
stays one class Ray can host)."""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from controller.runtime.applying import Applier
from controller.runtime.history import acting_as, client
from controller.runtime.leasing import Leaser
from controller.runtime.liveness import Liveness
from controller.runtime.repair import Repairer
from controller.runtime.state import ReservationState
from controller.state import requests
from controller.state.owners import Caller, check_owner, owner_hash
from controller.state.requests import check_flag, check_job, check_timeout

log = logging.getLogger("placectl.controller")


class ChangeCalls:
    """``apply``, ``resize``, ``repair``, ``lease_ports``, ``release_ports``; the facade
    provides the attributes and ``_ready``/``_status_bytes``."""

    _state: ReservationState
    _applier: Applier
    _repairer: Repairer
    _leaser: Leaser
    _liveness: Liveness

    async def _ready(self) -> None:  # pragma: no cover - the facade's
        raise NotImplementedError

    def _status_bytes(self, res: Any) -> bytes:  # pragma: no cover - the facade's
        raise NotImplementedError

    def _owns(self, job: str, token: str, force: bool, what: str) -> Caller:
        """The caller of ``what`` on ``job``, refused at once when the record as it
        stands is another's and ``force`` is not given. The operation checks again,
        authoritatively, against the record it reads under the job's lock (and logs a
        forced change there)."""
        caller = Caller(requests.check_token(token), force)
        res = self._state.get(job)
        if res is not None:
            check_owner(res, caller.token, force, what)
        return caller

    async def apply(
        self,
        job: str,
        spec: Any,
        timeout_s: float = 300.0,
        dry_run: bool = False,
        token: str = "",
        force: bool = False,
    ) -> bytes:
        """Give the live reservation ``job`` the configuration ``spec``, touching only
        what changes; returns the encoded :class:`ApplySummary` (see :meth:`Applier.apply`
        for what it keeps and what it raises)."""
        await self._ready()
        job = check_job(job)
        caller = self._owns(job, token, check_flag(force, "force"), "apply")
        spec = requests.coerce_spec(spec)
        timeout = check_timeout(timeout_s)
        check_flag(dry_run, "dry_run")
        with acting_as(client(owner_hash(token), force)):
            summary = await self._applier.apply(job, spec, timeout, dry_run, caller)
        return msgspec.msgpack.encode(summary)

    async def resize(
        self,
        job: str,
        component: str,
        placement: str | None = None,
        node_group: str | list[str] | None = None,
        timeout_s: float = 300.0,
        dry_run: bool = False,
        token: str = "",
        force: bool = False,
    ) -> bytes:
        """:meth:`apply` with one component placed anew (see :meth:`Applier.resize`)."""
        await self._ready()
        job = check_job(job)
        caller = self._owns(job, token, check_flag(force, "force"), "resize")
        timeout = check_timeout(timeout_s)
        check_flag(dry_run, "dry_run")
        with acting_as(client(owner_hash(token), force)):
            summary = await self._applier.resize(
                job, component, placement, node_group, timeout, dry_run, caller
            )
        return msgspec.msgpack.encode(summary)

    async def repair(self, job: str, token: str = "", force: bool = False) -> bytes:
        """Replace the broken slots of a degraded reservation now, whatever its repair
        policy; returns its status (still degraded, with the reason, if it could not).
        A node of the job whose raylet refuses connections is fenced first."""
        await self._ready()
        caller = self._owns(check_job(job), token, check_flag(force, "force"), "repair")
        res = self._state.get(job)
        if res is not None and res.settled:
            await self._liveness.check_now(res.node_ids())
        with acting_as(client(owner_hash(token), force)):
            await self._repairer.repair(job, caller)
        return self._status_bytes(self._state.require(job))

    async def lease_ports(
        self,
        job: str,
        component: str,
        rank: int = 0,
        count: int = 1,
        consecutive: bool = True,
        name: str | None = None,
        request_id: str | None = None,
        token: str = "",
        force: bool = False,
    ) -> list[int]:
        """Lease ``count`` ports on the node of ``component``'s ``rank`` (see
        :meth:`Leaser.lease_ports`)."""
        await self._ready()
        caller = self._owns(check_job(job), token, check_flag(force, "force"), "a port lease")
        return await self._leaser.lease_ports(
            job, component, rank, count, consecutive, name, request_id, caller
        )

    async def release_ports(
        self, job: str, ports: list[int], token: str = "", force: bool = False
    ) -> int:
        """End the leases holding any of ``ports``; returns how many."""
        await self._ready()
        caller = self._owns(check_job(job), token, check_flag(force, "force"), "a port release")
        return await self._leaser.release_ports(job, ports, caller)


__all__ = ["ChangeCalls"]
