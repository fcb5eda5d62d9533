"""The placement controller: one named, detached Ray actor per cluster."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import secrets
from typing import Any

import msgspec

from controller.errors import (
    PlacementError,
    ReservationError,
    TableUnreadable,
    UnknownReservation,
)
from controller.runtime.applying import ApplyingMixin
from controller.runtime.io import ClusterIO
from controller.runtime.leasing import Leasing
from controller.runtime.reconcile import Reconciling
from controller.runtime.repair import Repairing
from controller.runtime.reserving import Reserving
from controller.runtime.settings import Settings
from controller.runtime.store import Store
from controller.state.published import Published
from controller.state.records import GROUP_PREFIX, STATES, ReservationRecord
from controller.state.requests import check_job
from controller.state.status import ReservationInfo, summarize
from controller.state.table import KV_NAMESPACE, StoredPlan, kv_prefix, where

log = logging.getLogger("placectl.controller")

FAULT_STEPS = frozenset(
    {
        "after_plan",
        "after_create",
        "after_ready",
        "after_probe",
        "after_write",
        "release_after_mark",
        "release_after_remove",
        "replace_after_plan",
        "replace_after_create",
        "replace_after_probe",
        "replace_after_write",
        "apply_after_intent",
        "apply_after_rebuild_removal",
        "apply_after_create",
        "apply_after_probe",
        "apply_after_write",
    }
)
RECOVERY_WAIT_S = 60.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class SimulatedCrash(BaseException):
    """A test fault in a controller that must not exit its process (the fake cluster's):
    it unwinds the call without running any rollback, as a real crash would."""


class PlacementController(Reserving, ApplyingMixin, Reconciling, Repairing, Leasing):
    """Owns every placectl reservation of a cluster.

    Fault-tolerance contract:

    * **Intent first.** Every change is written to the GCS key-value store before it is
      applied in memory and before the call returns; a write that fails changes nothing
      (the call fails, memory still equals the table). A reservation is recorded
      ``pending`` before any group exists and ``releasing`` before any is removed.
    * **Idempotent calls.** Reserving a job again with the same spec returns it,
      releasing an absent job does nothing, a lease is found again by its name or
      request id. A client may retry any call after a restart, and Ray does so for
      calls in flight (``max_task_retries=-1``).
    * **Detached groups, remembered by id.** They outlive drivers and the controller.
      Workers belong to the drivers that launched them: a restart never stops training.
    * **The loop starts with the actor**, not with a call: recovery, then every
      ``settings.reconcile_period`` a tick driven by Ray's node events (a lost node is marked
      degraded and, under the ``auto`` repair policy, its slot replaced), with a full
      check of every group every ``settings.full_check_period`` as a safety net. The loop never
      dies: a failing tick is logged and the next one runs.
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
        if io is None:
            from controller.runtime.ray_io import RayClusterIO

            io = RayClusterIO(KV_NAMESPACE, kv_prefix(name))
            self._exit_on_crash = True
        else:
            self._exit_on_crash = False
        self._name = name
        self._io = io
        self._store = Store(io)
        self._prefix = f"{GROUP_PREFIX}{name}:"
        self._incarnation = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.settings = settings or Settings()
        self._records: dict[str, ReservationRecord] = {}
        self._states: dict[str, int] = dict.fromkeys(STATES, 0)
        self._ledger: dict[str, collections.Counter] = {}  # node id -> leased ports
        self._epochs: dict[str, int] = {}
        self._plans: dict[str, StoredPlan] = {}
        self._published: dict[str, Published] = {}
        self._encoded: dict[str, dict[str, bytes]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._progress: dict[str, str] = {}
        self._refusal: str | None = None
        self._recovered = asyncio.Event()
        self._fault: str | None = None
        self._dead = False
        self.last_timings: dict[str, float] = {}
        self.bytes_written = 0
        self._init_reserving()
        self._init_reconciling()
        self._init_repairing()
        self._init_leasing()
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    # ------------------------------------------------------------ lifecycle
    async def _run(self) -> None:
        delay = 0.5
        while not self._recovered.is_set():
            try:
                await self._recover()
                self._recovered.set()
            except TableUnreadable as e:
                self._refuse(str(e))
                self._recovered.set()  # calls answer now: with the refusal
            except Exception as e:
                log.exception("recovery failed; retrying in %.1fs", delay)
                self._recovery_problem = str(e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        while not self._dead:
            await self._idle()
            try:
                await self._tick()
            except Exception:
                log.exception("reconcile tick failed; the next one will run")

    def _refuse(self, why: str) -> None:
        if why != self._refusal:
            log.error("refusing to act: the reservation table cannot be read: %s", why)
        self._refusal = why

    async def _ready(self) -> None:
        if not self._recovered.is_set():
            try:
                await asyncio.wait_for(self._recovered.wait(), RECOVERY_WAIT_S)
            except asyncio.TimeoutError:
                why = getattr(self, "_recovery_problem", "")
                raise ReservationError(
                    f"the controller has not recovered after {RECOVERY_WAIT_S:g}s: {why}"
                ) from None
        if self._refusal is not None:
            raise TableUnreadable(
                f"placectl refuses to act because the reservation table cannot be read: "
                f"{self._refusal}. Nothing was removed; run a placectl that reads it, or "
                f"remove the unreadable keys ({where(self._name)})"
            )

    async def stop(self) -> None:
        """Stop the loop (tests: a controller object that is discarded)."""
        self._dead = True
        self._loop_task.cancel()
        for task in [*self._reserving.values(), *self._repair_tasks.values()]:
            task.cancel()

    def _crash_point(self, step: str) -> None:
        if self._fault != step:
            return
        log.warning("test fault injected at %s", step)
        if self._exit_on_crash:
            os._exit(1)
        self._dead = True
        raise SimulatedCrash(step)

    # ------------------------------------------------------------ persistence
    async def _commit(
        self,
        record: ReservationRecord,
        *,
        plan: StoredPlan | None = None,
        published: Published | None = None,
    ) -> None:
        """Write ``record`` (and what changed with it), then make it current in memory."""
        if plan is None and published is None and record.epoch == self._epochs.get(record.job):
            self.bytes_written += await self._store.write_record(record)
        else:
            self.bytes_written += await self._store.write(record, plan, published)
        job = record.job
        old = self._records.get(job)
        self._records[job] = record
        self._epochs[job] = max(self._epochs.get(job, 0), record.epoch)
        if plan is not None:
            self._plans[job] = plan
        if published is not None:
            self._published[job] = published
            self._encoded.pop(job, None)
        self._index(job, old, record)
        self._account(old, record)

    async def _forget(self, job: str) -> None:
        if job in self._records:
            await self._store.delete(self._records[job])
        old = self._records.pop(job, None)
        self._plans.pop(job, None)
        self._published.pop(job, None)
        self._encoded.pop(job, None)
        self._progress.pop(job, None)
        self._index(job, old, None)
        self._account(old, None)
        self._io.metrics.forget(job)

    def _observe(self) -> None:
        """Recount everything (after recovery) and report it."""
        self._states = dict.fromkeys(STATES, 0)
        self._ledger = {}
        for r in self._records.values():
            self._account(None, r, report=False)
        self._io.metrics.observe(
            self._states, {j: r.accelerators() for j, r in self._records.items()}
        )

    def _account(
        self, old: ReservationRecord | None, new: ReservationRecord | None, report: bool = True
    ) -> None:
        """Keep state counts and the port ledger in step with one record's change, so a
        commit costs what its job costs, not what the cluster holds."""
        for record, sign in ((old, -1), (new, 1)):
            if record is None:
                continue
            self._states[record.state] = self._states.get(record.state, 0) + sign
            for lease in record.leases:
                held = self._ledger.setdefault(lease.node_id, collections.Counter())
                for port in lease.ports:
                    held[port] += sign
                    if held[port] <= 0:
                        del held[port]
        if report:
            accelerators = {new.job: new.accelerators()} if new is not None else {}
            self._io.metrics.observe(self._states, accelerators)

    def _lock(self, job: str) -> asyncio.Lock:
        return self._locks.setdefault(job, asyncio.Lock())

    async def _plan_of(self, job: str) -> StoredPlan:
        plan = self._plans.get(job)
        if plan is None:
            plan = await self._store.plan(job)
            if plan is None:
                raise ReservationError(f"the plan of {job!r} is missing from the table")
            self._plans[job] = plan
        return plan

    async def _published_of(self, job: str) -> Published:
        published = self._published.get(job)
        record = self._records[job]
        if published is None or published.epoch != record.epoch or published.uid != record.uid:
            published = await self._store.published(record)
            if published is None or published.uid != record.uid:
                raise ReservationError(f"the assignments of {job!r} are missing from the table")
            self._published[job] = published
        return published

    # ------------------------------------------------------------ lookups
    def _get(self, job: str) -> ReservationRecord:
        check_job(job)
        res = self._records.get(job)
        if res is None:
            known = ", ".join(sorted(self._records)) or "none"
            raise UnknownReservation(f"no reservation named {job!r} (reserved: {known})")
        return res

    def _info(self, res: ReservationRecord) -> ReservationInfo:
        return summarize(self._truthful(res))

    def _status_bytes(self, res: ReservationRecord) -> bytes:
        return msgspec.msgpack.encode(self._info(res))

    async def assignments(self, job: str, component: str) -> bytes:
        """The msgpack-encoded ``list[Assignment]`` of one component, in rank order."""
        await self._ready()
        await self._confirm([check_job(job)])
        res = self._get(job)
        if not res.settled:
            raise ReservationError(f"reservation {job!r} is {res.state}; assignments need ready")
        encoded = self._encoded.get(job)
        if encoded is None:
            published = await self._published_of(job)
            encoded = {
                n: msgspec.msgpack.encode(b.assignments()) for n, b in published.components.items()
            }
            self._encoded[job] = encoded
        if component not in encoded:
            raise PlacementError(
                f"unknown component {component!r} in {job!r}; it has {', '.join(encoded)}"
            )
        return encoded[component]

    async def component(self, job: str, component: str) -> bytes:
        """The msgpack-encoded :class:`ComponentBlock` of ``job``'s current epoch."""
        await self._ready()
        await self._confirm([check_job(job)])
        res = self._get(job)
        if not res.settled:
            raise ReservationError(f"reservation {job!r} is {res.state}; assignments need ready")
        published = await self._published_of(job)
        if component not in published.components:
            raise PlacementError(f"unknown component {component!r} in {job!r}")
        return msgspec.msgpack.encode(published.components[component])

    async def status(self, job: str) -> bytes:
        """The encoded :class:`ReservationInfo` of ``job``: never ``ready`` while Ray
        reports one of its nodes dead."""
        await self._ready()
        await self._confirm([check_job(job)])
        return self._status_bytes(self._get(job))

    async def list(self) -> bytes:
        """Encoded ``list[ReservationInfo]`` of every reservation, by job name."""
        await self._ready()
        await self._confirm(list(self._records))
        return msgspec.msgpack.encode([self._info(self._records[j]) for j in sorted(self._records)])

    async def progress(self, job: str) -> str:
        """What a reservation in progress is waiting for ("" when nothing)."""
        return self._progress.get(job, "")

    async def check_alive(self) -> str:
        """Answers this incarnation's id, which changes on every restart; answers even
        while the controller refuses to act."""
        return self._incarnation

    async def health(self) -> dict[str, Any]:
        """The controller's own state: incarnation, node, recovered, the refusal if any."""
        return {
            "incarnation": self._incarnation,
            "node_id": self._io.own_node(),
            "recovered": self._recovered.is_set(),
            "refusal": self._refusal,
            "reservations": len(self._records),
        }

    # ------------------------------------------------------------ testing
    async def arm_fault(self, step: str | None) -> None:
        """Test only: crash the next time ``step`` is reached."""
        if step is not None and step not in FAULT_STEPS:
            raise ReservationError(f"fault step {step!r}: one of {', '.join(sorted(FAULT_STEPS))}")
        self._fault = step

    async def timings(self) -> dict[str, float]:
        """How long the last new reservation took to plan, place and probe."""
        return dict(self.last_timings)

    async def group_prefix(self) -> str:
        return self._prefix

    def _timing(self, **values: float) -> None:
        self.last_timings = {k: round(v, 6) for k, v in values.items()}
