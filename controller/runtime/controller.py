"""The placement controller: one named, detached Ray actor per cluster.

The actor is a facade. What it knows lives in one owner; what it does is done by the
operations it composes, each given the shared parts (a ``Context``) and, by name, the
other operations it uses:

* ``state``: the mirror of the table, and the only way to change it (write ahead);
* ``nodes``: the nodes as Ray last reported them, and the planner's view of them;
* ``locks``: who may change a job when (the rules are written in ``locks``);
* ``tasks``: every task run beside the calls, by name; ``stop()`` ends them all;
* ``checker``: what Ray says about each reservation, ready or degraded;
* ``leaser``: master ports and leased ports;
* ``repairer``: replacing a lost node's slots;
* ``reserver``: reserve, cancel, release; ``applier``: apply and resize;
* ``reconciler``: recovery on start, and the loop's ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import Any

import msgspec

from controller.errors import NotOwner, PlacementError, ReservationError, TableUnreadable
from controller.runtime.applying import Applier
from controller.runtime.change_calls import ChangeCalls
from controller.runtime.checks import Checker
from controller.runtime.context import Context
from controller.runtime.diagnostics import DiagnosticCalls
from controller.runtime.history import History, acting_as, client
from controller.runtime.incarnation import FAULT_STEPS, Incarnation, SimulatedCrash
from controller.runtime.io import ClusterIO
from controller.runtime.leasing import Leaser
from controller.runtime.liveness import Liveness
from controller.runtime.queue_calls import QueueCalls
from controller.runtime.reconcile import Reconciler
from controller.runtime.repair import Repairer
from controller.runtime.reserving import Reserver
from controller.runtime.settings import Settings
from controller.runtime.state import ReservationState
from controller.runtime.store import Store
from controller.runtime.tasks import Tasks
from controller.state import requests
from controller.state.owners import Caller, owner_hash, owns
from controller.state.queueing import Terms
from controller.state.records import AUTO, GROUP_PREFIX, ReservationRecord
from controller.state.requests import check_flag, check_job, check_policy, check_timeout
from controller.state.status import summarize
from controller.state.table import KV_NAMESPACE, kv_prefix, where
from controller.state.usage import usage

__all__ = ["FAULT_STEPS", "PlacementController", "SimulatedCrash"]

log = logging.getLogger("placectl.controller")

RECOVERY_WAIT_S = 60.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class PlacementController(ChangeCalls, QueueCalls, DiagnosticCalls):
    """Owns every placectl reservation of a cluster.

    Fault-tolerance contract:

    * **Intent first.** Every change is written to the GCS key-value store before it is
      applied in memory and before the call returns; a write that fails changes nothing
      (the call fails, memory still equals the table). A reservation is recorded
      ``pending`` before any group exists and ``releasing`` before any is removed. The
      state owner (:class:`ReservationState`) is the only way to change anything, so the
      rule holds in one place.
    * **Idempotent calls.** Reserving a job again with the same spec returns it,
      releasing an absent job does nothing, a lease is found again by its name or
      request id. A client may retry any call after a restart, and Ray does so for
      calls in flight (``max_task_retries=-1``).
    * **Detached groups, remembered by id.** They outlive drivers and the controller.
      Workers belong to the drivers that launched them: a restart never stops training.
    * **Readiness is true.** No call answers ``ready`` for a reservation holding a node
      Ray reports dead: what a call reads is confirmed against Ray first.
    * **The loop starts with the actor**, not with a call: recovery, then a tick
      whenever Ray's node events arrive and at least every
      ``settings.reconcile_period`` (a lost node is marked degraded and, under the
      ``auto`` repair policy, its slot replaced), with a full check of every group every
      ``settings.full_check_period`` as a safety net. The loop never dies: a failing
      tick is logged and the next one runs.
    * **Recovery** reloads the table, rolls back ``pending`` reservations cut short,
      finishes ``releasing`` ones, clears the intent of an ``apply`` cut short, and
      removes orphans: groups with this controller's name prefix that no record
      references (also at every full check).
    * **Removal is verified**: a release is done only once Ray reports every group gone.
    * **Apply keeps what does not change**: a new configuration for a live reservation
      keeps every slot whose bundles are unchanged and every rank whose placement is; it
      is all or nothing, and a restart in the middle of it rolls it back.
    * **An unreadable table is never acted on.** A table written by a newer placectl, or
      one that cannot be decoded, makes the controller refuse every call with the reason
      and touch nothing, not even orphans; the bytes stay. It tries again every few
      seconds. Older formats are migrated.
    * **A head restart** (GCS fault tolerance) is a restart on the new head over the kept
      table; while the GCS is away its calls wait for it (bounded, ``gcs_wait``).
    * **Identity.** Every reservation has a uid, new at each creation, and an epoch that
      only grows for a job name, so drivers and workers notice any change.

    Args:
        name: the actor's name; it prefixes group names and the table's namespace.
        io: the cluster; default the real one (Ray). Unit tests pass a FakeCluster.
        settings: timing and pacing (:class:`~controller.runtime.settings.Settings`).
    """

    def __init__(
        self,
        name: str = "placectl",
        io: ClusterIO | None = None,
        settings: Settings | None = None,
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ReservationError(
                f"controller name {name!r}: use letters, digits, '_', '.', '-' (no colon)"
            )
        real = io is None
        if io is None:
            from controller.runtime.ray_io import RayClusterIO

            io = RayClusterIO(KV_NAMESPACE, kv_prefix(name))
        self._name = name
        self._io = io
        self.settings = settings or Settings()
        prefix = f"{GROUP_PREFIX}{name}:"
        self._prefix = prefix
        self._incarnation = Incarnation(exit_process=real)
        tasks = Tasks()
        history = History(io.metrics, self.settings.events_kept)
        self._state = ReservationState(Store(io), io.metrics, history, tasks)
        ctx = Context(io, self._state, self.settings, prefix, self._incarnation, tasks)
        self._nodes, self._locks, self._tasks = ctx.nodes, ctx.locks, ctx.tasks
        self._progress = ctx.progress
        self._checker = Checker(ctx)
        self._leaser = Leaser(ctx)
        self._repairer = Repairer(ctx, self._checker, self._leaser)
        self._reserver = Reserver(ctx, self._checker, self._leaser, self._repairer)
        self._admitter = self._reserver.admitter
        self._applier = Applier(ctx, self._checker, self._leaser)
        self._reconciler = Reconciler(ctx, self._checker, self._reserver, self._repairer)
        self._liveness = Liveness(ctx, self._fenced)
        self._refusal: str | None = None
        self._recovery_problem = ""
        self._recovered = asyncio.Event()
        self._reported = float("-inf")
        self._tasks.start("loop", name, self._run())

    # ------------------------------------------------------------ for tests, benchmarks
    @property
    def state(self) -> ReservationState:
        """The state owner (read it; change nothing through it from outside)."""
        return self._state

    @property
    def reconciler(self) -> Reconciler:
        return self._reconciler

    @property
    def finished(self) -> bool:
        """This incarnation crashed at a test fault or was stopped."""
        return self._incarnation.dead

    # ------------------------------------------------------------ lifecycle
    async def _run(self) -> None:
        delay = 0.5
        while not self._recovered.is_set():
            try:
                await self._reconciler.recover()
                self._refusal = None
                self._recovered.set()
            except TableUnreadable as e:
                self._refuse(str(e))
                self._recovered.set()  # calls answer now: with the refusal
            except Exception as e:
                log.exception("recovery failed; retrying in %.1fs", delay)
                self._recovery_problem = str(e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        last_try = float("-inf")  # an unreadable table is read again at the first tick
        self._liveness.start()
        while not self._incarnation.dead:
            await self._checker.idle(self.settings.reconcile_period)
            try:
                if self._refusal is None:
                    await self._reconciler.tick()
                    await self._admitter.tick()
                    self._report()
                elif asyncio.get_running_loop().time() - last_try >= self.settings.refusal_retry:
                    last_try = asyncio.get_running_loop().time()
                    await self._retry_unreadable()
            except Exception:
                log.exception("reconcile tick failed; the next one will run")

    def _report(self) -> None:
        """The gauges that move with time (how long the oldest has waited) and with
        quotas, every ``settings.metrics_period``."""
        now = time.monotonic()
        if now - self._reported < self.settings.metrics_period:
            return
        self._reported = now
        records = self._state.records.values()
        self._io.metrics.queues(usage(records, self._state.quotas, time.time()))

    async def _retry_unreadable(self) -> None:
        try:
            await self._reconciler.recover()
        except TableUnreadable as e:
            self._refuse(str(e))
            return
        self._refusal = None
        log.warning("the reservation table is readable again; acting on it")

    def _refuse(self, why: str) -> None:
        if why != self._refusal:
            log.error("refusing to act: the reservation table cannot be read: %s", why)
        self._refusal = why

    async def _ready(self) -> None:
        """Every call but the liveness ones waits for recovery, and is refused while the
        table cannot be read."""
        if not self._recovered.is_set():
            try:
                await asyncio.wait_for(self._recovered.wait(), RECOVERY_WAIT_S)
            except asyncio.TimeoutError:
                raise ReservationError(
                    f"the controller has not recovered after {RECOVERY_WAIT_S:g}s: "
                    f"{self._recovery_problem}"
                ) from None
        if self._refusal is not None:
            raise TableUnreadable(
                f"placectl refuses to act because the reservation table cannot be read: "
                f"{self._refusal}. Nothing was removed; run a placectl that reads it, or "
                f"remove the unreadable keys ({where(self._name)})"
            )

    async def stop(self) -> None:
        """Stop the loop (tests: a controller object that is discarded)."""
        self._incarnation.dead = True
        with contextlib.suppress(Exception):  # the last events, if the GCS takes them
            last = min(2.0, self.settings.removal_timeout)
            await asyncio.wait_for(self._state.write_history(), last)
        self._tasks.stop()

    def _fenced(self, node: str) -> None:
        """A node was fenced: its jobs are checked, and repaired, at once."""
        for job in self._state.jobs_on(node):
            self._checker.recheck(job)
        self._checker.wake()

    # ------------------------------------------------------------ changes
    async def reserve(
        self,
        job: str,
        spec: Any,
        timeout_s: float = 300.0,
        replace: bool = False,
        repair: str = AUTO,
        queue: str = "",
        priority: int = 0,
        token: str = "",
        force: bool = False,
        preemptible: bool = False,
        preempt_grace_s: float = 0.0,
    ) -> bytes:
        """Reserve the resources of ``spec`` for ``job`` (in ``queue`` at ``priority``,
        if given), owned by ``token``'s holder; returns the encoded status (see
        :meth:`Reserver.reserve`). Replacing another's spec needs its token or ``force``."""
        await self._ready()
        job = check_job(job)
        spec = requests.coerce_spec(spec)
        timeout = check_timeout(timeout_s)
        check_flag(replace, "replace")
        policy = check_policy(repair)
        queue, priority = requests.check_queue(queue), requests.check_priority(priority)
        caller = self._owns(job, token, force, "replace") if replace else None
        terms = Terms(
            queue=queue,
            priority=priority,
            owner=owner_hash(requests.check_token(token)),
            preemptible=check_flag(preemptible, "preemptible"),
            preempt_grace=check_timeout(preempt_grace_s, "preempt_grace_s")
            if preempt_grace_s
            else 0.0,
        )
        with acting_as(client(terms.owner, force)):
            res = await self._reserver.reserve(job, spec, timeout, replace, policy, terms, caller)
        return self._status_bytes(res)

    async def cancel(self, job: str) -> bool:
        """Cancel a ``reserve`` of ``job`` in progress; True if there was one."""
        await self._ready()
        return await self._reserver.cancel(check_job(job))

    async def release(self, job: str, token: str = "", force: bool = False) -> bool:
        """Remove ``job``'s reservation; True if there was one (see :meth:`Reserver.release`)."""
        await self._ready()
        caller = self._owns(check_job(job), token, check_flag(force, "force"), "release")
        with acting_as(client(owner_hash(token), force)):
            return await self._reserver.release(job, caller)

    async def release_all(self, token: str = "", force: bool = False) -> list[str]:
        """Release every reservation the caller owns (every one with ``force``); returns
        the jobs released."""
        await self._ready()
        check_flag(force, "force")
        jobs = [j for j, r in self._state.records.items() if force or owns(r, token)]
        if force:
            log.warning("release of every reservation forced (%d)", len(jobs))
        caller, released = Caller(requests.check_token(token), force), []
        for job in sorted(jobs):
            # NotOwner: reserved anew by another client meanwhile
            with contextlib.suppress(NotOwner), acting_as(client(owner_hash(token), force)):
                if await self._reserver.release(job, caller):
                    released.append(job)
        return released

    # ------------------------------------------------------------ reads
    def _status_bytes(self, res: ReservationRecord) -> bytes:
        return msgspec.msgpack.encode(summarize(self._checker.truthful(res)))

    async def _settled(self, job: str) -> ReservationRecord:
        await self._checker.confirm([check_job(job)])
        res = self._state.require(job)
        if not res.settled:
            raise ReservationError(f"reservation {job!r} is {res.state}; assignments need ready")
        return res

    async def assignments(self, job: str, component: str) -> bytes:
        """The msgpack-encoded ``list[Assignment]`` of one component, in rank order."""
        await self._ready()
        await self._settled(job)
        encoded = await self._state.encoded(job)
        if component not in encoded:
            raise PlacementError(
                f"unknown component {component!r} in {job!r}; it has {', '.join(encoded)}"
            )
        return encoded[component]

    async def component(self, job: str, component: str) -> bytes:
        """The msgpack-encoded :class:`ComponentBlock` of ``job``'s current epoch."""
        await self._ready()
        await self._settled(job)
        published = await self._state.published(job)
        if component not in published.components:
            raise PlacementError(f"unknown component {component!r} in {job!r}")
        return msgspec.msgpack.encode(published.components[component])

    async def status(self, job: str) -> bytes:
        """The encoded :class:`ReservationInfo` of ``job``: never ``ready`` while Ray
        reports one of its nodes dead, nor while one of its raylets refuses connections
        (the node is fenced first, see :mod:`controller.runtime.liveness`)."""
        await self._ready()
        await self._suspect(check_job(job))
        await self._checker.confirm([job])
        return self._status_bytes(self._state.require(job))

    async def _suspect(self, job: str) -> set[str]:
        """Ask the raylets of ``job``'s nodes now; the ones silent, not yet fenced."""
        res = self._state.get(job)
        if res is None or not res.settled:
            return set()
        return await self._liveness.check_now(res.node_ids())

    async def suspects(self, job: str) -> list[str]:
        """The nodes of ``job`` whose raylets do not answer now and that are not fenced
        yet (each is fenced once silent for ``settings.fence_after``); a refusing one is
        fenced by this call. Drivers call it when a worker stops answering."""
        await self._ready()
        suspects = await self._suspect(check_job(job))
        await self._checker.confirm([job])
        return sorted(suspects)

    async def list(self) -> bytes:
        """Encoded ``list[ReservationInfo]`` of every reservation, by job name."""
        await self._ready()
        records = self._state.records
        await self._checker.confirm(list(records))
        infos = [summarize(self._checker.truthful(records[j])) for j in sorted(records)]
        return msgspec.msgpack.encode(infos)
