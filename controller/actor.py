"""The placement controller: one named, detached Ray actor per cluster."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from typing import Any

import msgspec
from ray.experimental import internal_kv

from controller import groups as groups_io
from controller import raylib
from controller.components import ComponentPlacement
from controller.errors import PlacementError
from controller.leasing import PortLeasing
from controller.metrics import ControllerMetrics
from controller.node_groups import choose_floating
from controller.ports import MASTER
from controller.repair import repair, stale_groups
from controller.reservations import (
    DEGRADED,
    GROUP_PREFIX,
    PENDING,
    READY,
    RELEASING,
    TABLE_KEY,
    ReservationConflict,
    ReservationError,
    ReservationRecord,
    Table,
    UnknownReservation,
    build_assignments,
    check_job,
    check_timeout,
    coerce_spec,
    decode_table,
    describe_difference,
    encode_table,
    kv_namespace,
    plan_of,
    plan_slots,
)
from controller.spec import ClusterSpec
from controller.status import summarize

log = logging.getLogger("placectl.controller")

RECONCILE_PERIOD_S = 1.0
WARM_PERIOD_S = 30.0
FAULT_STEPS = frozenset(
    {
        "replace_after_plan",
        "replace_after_create",
        "replace_after_probe",
        "replace_after_write",
        "release_after_remove",
        "after_plan",
        "after_create",
        "after_ready",
        "after_probe",
        "after_write",
        "release_after_mark",
    }
)


class PlacementController(PortLeasing):
    """Owns every placectl reservation of a cluster.

    Fault-tolerance contract:

    * Every mutating call (``reserve``, ``release``) writes the reservation table to the
      GCS key-value store before it returns, and every one is idempotent: reserving a
      job again with the same specification returns the existing reservation, releasing
      an absent job does nothing. A client may therefore retry any call after a
      controller restart; Ray does so itself for calls in flight (``max_task_retries=-1``).
    * Placement groups are detached and remembered by id: they outlive drivers and the
      controller. Workers belong to the drivers that launched them, so a controller
      restart never stops training.
    * On start the controller reloads the table and checks every group. A reservation
      whose ``reserve`` or ``release`` was cut short is rolled back (its groups removed,
      the record dropped; a retried ``reserve`` builds it anew). Orphans, groups with this
      controller's name prefix that no kept reservation references (left by a crash
      between creating a group and recording it), are removed.
    * A reconcile loop marks a reservation degraded within about a second of one of its
      nodes dying or one of its groups leaving CREATED, and ready again when that clears.
    """

    def __init__(self, name: str = "placectl") -> None:
        self._name = name
        self._incarnation = f"{os.getpid()}-{time.time()}"
        self._prefix = f"{GROUP_PREFIX}{name}:"
        self._kv_ns = kv_namespace(name)
        self._locks: dict[str, asyncio.Lock] = {}
        self._repairing: set[str] = set()
        self._repair_lock = asyncio.Lock()
        self._ports_lock = asyncio.Lock()  # one ledger for the cluster: leases serialize
        self._progress: dict[str, str] = {}
        self._plans: dict[str, ComponentPlacement] = {}
        self._encoded: dict[tuple[str, int], dict[str, bytes]] = {}
        self._fault: str | None = None
        self.last_timings: dict[str, float] = {}
        self._warmed: set[str] = set()
        self._warmed_at = time.monotonic()
        self._loop_task: asyncio.Task | None = None
        self._metrics = ControllerMetrics()
        self._table = self._load()
        self._recover()
        self._warm_nodes(groups_io.alive_node_ids())

    # ------------------------------------------------------------ persistence
    def _load(self) -> Table:
        data = internal_kv._internal_kv_get(TABLE_KEY, namespace=self._kv_ns)
        try:
            return decode_table(data)
        except (ReservationError, msgspec.DecodeError, msgspec.ValidationError) as e:
            # Keep the unreadable bytes for a human, start empty rather than crash-loop.
            internal_kv._internal_kv_put(TABLE_KEY + b".unreadable", data, namespace=self._kv_ns)
            log.error(
                "reservation table unreadable (%s); kept as %r", e, TABLE_KEY + b".unreadable"
            )
            return Table()

    def _save(self) -> None:
        internal_kv._internal_kv_put(
            TABLE_KEY, encode_table(self._table), overwrite=True, namespace=self._kv_ns
        )
        self._metrics.observe(self._table.reservations)

    def _crash_point(self, step: str) -> None:
        if self._fault == step:
            log.warning("test fault injected at %s: exiting", step)
            os._exit(1)

    # ------------------------------------------------------------ recovery
    def _recover(self) -> None:
        groups_io.recover(self._table, self._prefix)
        self._save()

    # ------------------------------------------------------------ reconcile loop
    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._reconcile_forever())

    async def _reconcile_forever(self) -> None:
        while True:
            await asyncio.sleep(RECONCILE_PERIOD_S)
            try:
                # GCS reads block; do them off the event loop so lookups never wait.
                groups, alive = await asyncio.to_thread(groups_io.snapshot)
                self._warm_nodes(alive)
                self.reconcile_once(groups, alive)
                for job, res in self._table.reservations.items():
                    if res.state == DEGRADED and job not in self._repairing:
                        self._repairing.add(job)
                        asyncio.get_running_loop().create_task(self._repair(job))
            except Exception:
                log.exception("reconcile failed; will try again")

    def _warm_nodes(self, alive: set[str]) -> None:
        # One idle worker per node answers that node's probes; starting it here, off the
        # reserve path, saves a worker start (~0.3 s) per node on a reservation. New
        # nodes are warmed at once, all of them again every WARM_PERIOD_S.
        if time.monotonic() - self._warmed_at > WARM_PERIOD_S:
            self._warmed, self._warmed_at = set(), time.monotonic()
        for node_id in alive - self._warmed:
            raylib.warm(node_id)
        self._warmed = set(alive)

    def reconcile_once(self, groups: dict, alive: set[str]) -> int:
        """Check every settled reservation against a snapshot of Ray's group table and
        alive nodes; returns how many changed state."""
        changed = 0
        for res in list(self._table.reservations.values()):
            if res.state not in (READY, DEGRADED):
                continue
            problems = groups_io.problems(res, groups, alive)
            state, reason = (DEGRADED, "; ".join(problems)) if problems else (READY, "")
            if state == res.state == DEGRADED:
                continue  # while degraded, the repair owns the reason
            if (state, reason) != (res.state, res.reason):
                log.warning("reservation %r is now %s %s", res.job, state, reason)
                res.state, res.reason = state, reason
                changed += 1
        if changed:
            self._save()
        return changed

    async def _lease_master(self, res: ReservationRecord, component: str) -> None:
        await self._lease(res, component, 0, 1, False, MASTER)

    async def _repair(self, job: str) -> None:
        """Replace the broken slots of a degraded reservation (see controller.repair)."""
        try:
            # One repair at a time: each one sees the resources the last one took.
            async with self._repair_lock, self._lock(job):
                res = self._table.reservations.get(job)
                if res is None or res.state != DEGRADED:
                    return
                new, why = await repair(res, self._prefix, self._crash_point, self._lease_master)
                if new is None:
                    if why and why != res.reason:
                        log.warning("reservation %r stays degraded: %s", job, why)
                        res.reason = why
                        self._save()
                    return
                new.state, new.reason = READY, ""
                self._table.reservations[job] = new
                self._plans.pop(job, None)
                self._save()
                self._crash_point("replace_after_write")
                groups, _ = await asyncio.to_thread(groups_io.snapshot)
                groups_io.remove_ids(stale_groups(res.slots, new), groups)
        except Exception:
            log.exception("repairing %r failed; will try again", job)
        finally:
            self._repairing.discard(job)

    # ------------------------------------------------------------ reserve
    def _lock(self, job: str) -> asyncio.Lock:
        return self._locks.setdefault(job, asyncio.Lock())

    def _say(self, job: str, message: str) -> None:
        self._progress[job] = message

    async def reserve(
        self, job: str, spec: Any, timeout_s: float = 300.0, replace: bool = False
    ) -> bytes:
        """Reserve the resources of ``spec`` for ``job``; returns the encoded status.

        Same job and same spec returns the existing reservation without creating
        anything; a different spec is a :class:`ReservationConflict` unless ``replace``.
        On timeout every group made for the attempt is removed.
        """
        self._ensure_loop()
        job = check_job(job)
        spec = coerce_spec(spec)
        timeout = check_timeout(timeout_s)
        if not isinstance(replace, bool):
            raise ReservationError(f"replace {replace!r}: expected True or False")
        async with self._lock(job):
            started = time.monotonic()
            existing = self._table.reservations.get(job)
            if existing is not None:
                if existing.spec == spec:
                    return self._status_bytes(existing)
                if not replace:
                    raise ReservationConflict(
                        f"job {job!r} is already reserved with a different configuration "
                        f"({describe_difference(existing.spec, spec)}); release it first or "
                        "pass replace=True"
                    )
                await self._release_locked(job)
            res = await self._create(job, spec, started + timeout)
            self._metrics.latency.observe(time.monotonic() - started)
            return self._status_bytes(res)

    async def _create(self, job: str, spec: ClusterSpec, deadline: float) -> ReservationRecord:
        entered = time.monotonic()
        view = await groups_io.wait_for_nodes(job, spec, deadline, lambda m: self._say(job, m))
        floating_groups = [g for g in spec.node_groups if g.floating]
        floating = (
            choose_floating(floating_groups, view, raylib.free_resources(), spec.accelerator)
            if floating_groups
            else {}
        )
        cp = ComponentPlacement(spec, view, floating)
        self._crash_point("after_plan")
        prefix = f"{self._prefix}{job}:{secrets.token_hex(3)}:"
        res = ReservationRecord(
            job=job,
            spec=spec,
            view=view,
            floating=floating,
            slots=plan_slots(cp, prefix),
            state=PENDING,
            created_at=time.time(),
        )
        self._table.reservations[job] = res
        self._save()
        try:
            t0 = time.monotonic()
            handles = groups_io.create(res)
            self._crash_point("after_create")
            await groups_io.wait_ready(res, handles, deadline, lambda m: self._say(job, m))
            self._crash_point("after_ready")
            t1 = time.monotonic()
            self._say(job, "probing accelerator ids")
            await groups_io.probe(res, deadline)
            self._crash_point("after_probe")
            t2 = time.monotonic()
            self._plans[job] = cp
            for name in cp.components:
                await self._lease(res, name, 0, 1, False, MASTER)
            self._encode_assignments(res)  # node-group env clashes surface here
            self.last_timings = {"plan_s": t0 - entered, "place_s": t1 - t0, "probe_s": t2 - t1}
        except BaseException:
            groups_io.remove(res)
            self._table.reservations.pop(job, None)
            self._plans.pop(job, None)
            self._progress.pop(job, None)
            self._save()
            raise
        res.state = READY
        self._save()
        self._progress.pop(job, None)
        self._crash_point("after_write")
        log.info(
            "reserved %r: %d node slots, %d accelerators", job, len(res.slots), res.accelerators()
        )
        return res

    # ------------------------------------------------------------ lookups
    def _get(self, job: str) -> ReservationRecord:
        check_job(job)
        res = self._table.reservations.get(job)
        if res is None:
            known = ", ".join(sorted(self._table.reservations)) or "none"
            raise UnknownReservation(f"no reservation named {job!r} (reserved: {known})")
        return res

    def _plan(self, res: ReservationRecord) -> ComponentPlacement:
        cp = self._plans.get(res.job)
        if cp is None:
            cp = self._plans[res.job] = plan_of(res)
        return cp

    def _encode_assignments(self, res: ReservationRecord) -> dict[str, bytes]:
        key = (res.job, res.epoch)
        cached = self._encoded.get(key)
        if cached is not None:
            return cached
        built = build_assignments(res, self._plan(res))
        encoded = {name: msgspec.msgpack.encode(items) for name, items in built.items()}
        self._encoded = {k: v for k, v in self._encoded.items() if k[0] != res.job}
        self._encoded[key] = encoded
        return encoded

    def _info(self, res: ReservationRecord):
        settled = res.state in (READY, DEGRADED) or res.job in self._plans
        cp = self._plan(res) if settled else None
        return summarize(res, {n: cp.world_size(n) for n in cp.components} if cp else {})

    def _status_bytes(self, res: ReservationRecord) -> bytes:
        return msgspec.msgpack.encode(self._info(res))

    async def assignments(self, job: str, component: str) -> bytes:
        """The msgpack-encoded ``list[Assignment]`` of one component, in rank order."""
        res = self._get(job)
        if res.state not in (READY, DEGRADED):
            raise ReservationError(f"reservation {job!r} is {res.state}; assignments need ready")
        encoded = self._encode_assignments(res)
        if component not in encoded:
            raise PlacementError(
                f"unknown component {component!r} in {job!r}; it has {', '.join(encoded)}"
            )
        return encoded[component]

    async def status(self, job: str) -> bytes:
        """The encoded :class:`ReservationInfo` of ``job``."""
        self._ensure_loop()
        return self._status_bytes(self._get(job))

    async def list(self) -> bytes:
        """Encoded ``list[ReservationInfo]`` of every reservation, by job name."""
        self._ensure_loop()
        infos = [self._info(self._table.reservations[j]) for j in sorted(self._table.reservations)]
        return msgspec.msgpack.encode(infos)

    async def progress(self, job: str) -> str:
        """What a reservation in progress is waiting for ("" when nothing)."""
        return self._progress.get(job, "")

    async def check_alive(self) -> str:
        """A no-op; answers this incarnation's id, which changes on every restart."""
        self._ensure_loop()
        return self._incarnation

    # ------------------------------------------------------------ release
    async def _release_locked(self, job: str) -> bool:
        res = self._table.reservations.get(job)
        if res is None:
            return False
        res.state = RELEASING
        self._save()
        self._crash_point("release_after_mark")
        groups_io.remove(res)
        self._crash_point("release_after_remove")
        del self._table.reservations[job]
        self._plans.pop(job, None)
        self._encoded = {k: v for k, v in self._encoded.items() if k[0] != job}
        self._metrics.forget(job)
        self._save()
        log.info("released %r", job)
        return True

    async def release(self, job: str) -> bool:
        """Remove ``job``'s groups and record; True if there was one. Idempotent."""
        self._ensure_loop()
        job = check_job(job)
        async with self._lock(job):
            return await self._release_locked(job)

    async def release_all(self) -> list[str]:
        """Release every reservation; returns the jobs released."""
        done = []
        for job in sorted(self._table.reservations):
            if await self.release(job):
                done.append(job)
        return done

    # ------------------------------------------------------------ testing
    async def arm_fault(self, step: str | None) -> None:
        """Test only: exit the process the next time ``step`` is reached."""
        if step is not None and step not in FAULT_STEPS:
            raise ReservationError(f"fault step {step!r}: one of {', '.join(sorted(FAULT_STEPS))}")
        self._fault = step

    async def timings(self) -> dict[str, float]:
        """How long the last new reservation took to place and to probe."""
        return dict(self.last_timings)

    async def group_prefix(self) -> str:
        return self._prefix
