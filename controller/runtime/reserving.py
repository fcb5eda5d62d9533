"""Reserve, cancel and release (a mixin of PlacementController)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

import msgspec

from controller.errors import (
    ReservationCancelled,
    ReservationConflict,
    ReservationError,
    ReservationTimeout,
)
from controller.planning.cluster import ClusterView, NodeView, order_nodes
from controller.planning.components import ComponentPlacement
from controller.planning.node_groups import choose_floating
from controller.runtime import groups
from controller.runtime.io import NodeInfo
from controller.state.diff import describe_difference
from controller.state.plan import JobPlan, plan_slots
from controller.state.published import publish
from controller.state.records import AUTO, PENDING, READY, RELEASING, ReservationRecord
from controller.state.requests import (
    check_flag,
    check_job,
    check_policy,
    check_timeout,
    coerce_spec,
)
from controller.state.table import StoredPlan

log = logging.getLogger("placectl.controller")
_BOOKKEEPING = ("CPU", "memory", "object_store_memory")


def node_view(n: NodeInfo, accelerator: str) -> NodeView:
    """One node as the planner sees it."""
    custom = {
        k: v
        for k, v in n.resources.items()
        if k != accelerator and k not in _BOOKKEEPING and not k.startswith("node:")
    }
    return NodeView(
        num_gpus=int(n.resources.get(accelerator, 0)),
        resources=custom,
        labels=dict(n.labels),
        node_id=n.node_id,
        ip=n.ip,
        is_head=n.is_head,
    )


def live_view(
    nodes: list[NodeInfo],
    accelerator: str,
    cache: dict[str, tuple[NodeInfo, NodeView]] | None = None,
) -> ClusterView:
    """The alive nodes, in node-rank order, as the planner sees them. With ``cache``,
    a node's view is built again only when what Ray reports of it changed."""
    views = []
    for n in nodes:
        if not n.alive:
            continue
        hit = cache.get(n.node_id) if cache is not None else None
        if hit is not None and hit[0] == n:
            views.append(hit[1])
            continue
        view = node_view(n, accelerator)
        if cache is not None:
            cache[n.node_id] = (n, view)
        views.append(view)
    return ClusterView(nodes=order_nodes(views))


class Reserving:
    """``reserve``, ``cancel``, ``release``; see PlacementController for the contract."""

    def _init_reserving(self) -> None:
        self._reserving: dict[str, asyncio.Task] = {}
        self._views: dict[str, dict[str, tuple[NodeInfo, NodeView]]] = {}
        self._cluster_views: dict[str, tuple[int, ClusterView]] = {}

    def _cluster_view(self, accelerator: str) -> ClusterView:
        """The alive nodes in node-rank order, kept from the nodes the loop follows
        (events, joins, full reads): a reserve costs what its job costs, not a read and
        a sort of the whole cluster."""
        cached = self._cluster_views.get(accelerator)
        if cached is not None and cached[0] == self._nodes_version:
            return cached[1]
        cache = self._views.setdefault(accelerator, {})
        view = live_view(list(self._node_info.values()), accelerator, cache)
        self._cluster_views[accelerator] = (self._nodes_version, view)
        return view

    def _say(self, job: str, message: str) -> None:
        self._progress[job] = message

    async def reserve(
        self,
        job: str,
        spec: Any,
        timeout_s: float = 300.0,
        replace: bool = False,
        repair: str = AUTO,
    ) -> bytes:
        """Reserve the resources of ``spec`` for ``job``; returns the encoded status.

        The same job and spec returns the existing reservation without creating anything
        (its repair policy updated), checked against Ray's node table first: one that
        holds a node Ray reports dead is repaired before it is returned (``auto``
        policy, within the timeout) or returned ``degraded`` (``manual``). A different
        spec is a :class:`ReservationConflict` unless ``replace``. On timeout, failure or
        cancellation every group made for the attempt is removed and nothing is
        recorded.
        """
        await self._ready()
        job = check_job(job)
        spec = coerce_spec(spec)
        timeout = check_timeout(timeout_s)
        check_flag(replace, "replace")
        policy = check_policy(repair)
        started = time.monotonic()
        await self._confirm([job])
        async with self._lock(job):
            existing = self._records.get(job)
            same = existing is not None and existing.settled and existing.spec == spec
            if same:
                if existing.repair != policy:
                    existing = msgspec.structs.replace(existing, repair=policy)
                    await self._commit(existing)
                if self._truthful(existing).state == READY or policy != AUTO:
                    return self._status_bytes(existing)
            else:
                if existing is not None and existing.settled and not replace:
                    raise ReservationConflict(
                        f"job {job!r} is already reserved with a different configuration "
                        f"({describe_difference(existing.spec, spec)}); release it first or "
                        "pass replace=True"
                    )
                if existing is not None:
                    await self._release_locked(job)
                res = await self._reserve_locked(job, spec, started, timeout, policy)
                return self._status_bytes(res)
        # The same spec, degraded under the auto policy: repaired before it is returned.
        return self._status_bytes(await self._repair_until(job, started + timeout))

    async def _reserve_locked(
        self, job: str, spec, started: float, timeout: float, policy: str
    ) -> ReservationRecord:
        """Create ``job``'s reservation (the caller holds its lock)."""
        self._reserving[job] = asyncio.current_task()
        try:
            res = await self._create(job, spec, started + timeout, policy)
        except asyncio.CancelledError:
            if self._dead:
                raise
            raise ReservationCancelled(
                f"reserve of {job!r} was cancelled; everything it had placed was removed"
            ) from None
        finally:
            self._reserving.pop(job, None)
            self._progress.pop(job, None)
        self._io.metrics.reserve_latency(time.monotonic() - started)
        return res

    async def cancel(self, job: str) -> bool:
        """Cancel a ``reserve`` of ``job`` in progress (it rolls back); True if there was
        one. An existing reservation is not touched."""
        await self._ready()
        task = self._reserving.get(check_job(job))
        if task is None:
            return False
        task.cancel()
        async with self._lock(job):  # the rollback is done once the lock is free
            return True

    async def _wait_for_nodes(self, job: str, spec, deadline: float) -> ClusterView:
        last_log = 0.0
        view = self._cluster_view(spec.accelerator)
        while True:
            if view.num_nodes >= spec.num_nodes:
                return view
            self._set_nodes(await self._io.nodes())  # a join the loop has not seen yet
            view = self._cluster_view(spec.accelerator)
            if view.num_nodes >= spec.num_nodes:
                return view
            message = f"waiting for nodes: {view.num_nodes} of {spec.num_nodes} alive"
            self._say(job, message)
            if time.monotonic() - last_log > groups.PROGRESS_LOG_PERIOD_S:
                log.info("%s: %s", job, message)
                last_log = time.monotonic()
            if time.monotonic() >= deadline:
                raise ReservationTimeout(
                    f"reservation {job!r} timed out: the cluster has {view.num_nodes} alive "
                    f"nodes, the configuration needs num_nodes={spec.num_nodes}"
                )
            await asyncio.sleep(0.5)

    async def _create(self, job: str, spec, deadline: float, policy: str) -> ReservationRecord:
        entered = time.monotonic()
        view = await self._wait_for_nodes(job, spec, deadline)
        floating_groups = [g for g in spec.node_groups if g.floating]
        floating = (
            choose_floating(
                floating_groups, view, await self._io.free_resources(), spec.accelerator
            )
            if floating_groups
            else {}
        )
        plan = JobPlan.of(ComponentPlacement(spec, view, floating))
        uid = secrets.token_hex(6)
        epoch = self._epochs.get(job, 0) + 1
        nodes = {nr: view.nodes[nr] for nr in plan.node_ranks()}
        record = ReservationRecord(
            job=job,
            uid=uid,
            epoch=epoch,
            spec=spec,
            nodes=nodes,
            floating=floating,
            slots=plan_slots(plan, spec, nodes, f"{self._prefix}{job}:{uid[:6]}:"),
            world_sizes=plan.world_sizes(),
            state=PENDING,
            repair=policy,
            created_at=time.time(),
        )
        stored = StoredPlan(job=job, uid=uid, epoch=epoch, plan=plan)
        self._crash_point("after_plan")
        await self._commit(record, plan=stored)
        created: dict[int, str] = {}
        holds: list = []
        try:
            t0 = time.monotonic()
            say = lambda m: self._say(job, m)  # noqa: E731
            slots = await groups.create_and_wait(
                self._io, job, record.slots, deadline, say, created
            )
            self._crash_point("after_create")
            record = msgspec.structs.replace(record, slots=slots)
            self._crash_point("after_ready")
            t1 = time.monotonic()
            self._say(job, "probing accelerator ids")
            slots = await groups.probe(self._io, job, slots, spec.accelerator, deadline)
            record = msgspec.structs.replace(record, slots=slots)
            self._crash_point("after_probe")
            t2 = time.monotonic()
            record = await self._lease_masters(record, plan, holds)
            published = publish(record, plan)  # node-group env clashes surface here
            ready = msgspec.structs.replace(record, state=READY)
            await self._commit(ready, published=published)
            self._timing(plan_s=t0 - entered, place_s=t1 - t0, probe_s=t2 - t1)
        except BaseException as e:
            if not self._dead:
                await self._rollback(record, created)
            raise e
        finally:
            self._drop_holds(holds)
        self._crash_point("after_write")
        log.info(
            "reserved %r: %d node slots, %d accelerators", job, len(slots), ready.accelerators()
        )
        return ready

    async def _rollback(self, record: ReservationRecord, created: dict[int, str]) -> None:
        """Undo a reservation that did not complete. Shielded from cancellation: a
        second cancel must not leave half of it behind."""

        async def undo() -> None:
            ids = set(created.values()) | record.group_ids()
            names = {s.group_name for s in record.slots}
            ids |= await groups.ids_by_name(self._io, names)  # made, never recorded
            left = await groups.remove_verified(self._io, ids, self.settings.removal_timeout)
            if left:
                marked = msgspec.structs.replace(
                    record, state=RELEASING, reason=f"rolling back: groups {sorted(left)} remain"
                )
                await self._commit(marked)
                return
            await self._forget(record.job)

        try:
            await asyncio.shield(undo())
        except Exception:
            log.exception("rolling back %r failed; the reconcile loop finishes it", record.job)

    # ------------------------------------------------------------ release
    async def _release_locked(self, job: str) -> bool:
        res = self._records.get(job)
        if res is None:
            return False
        if res.state != RELEASING:
            res = msgspec.structs.replace(res, state=RELEASING, reason="releasing")
            await self._commit(res)
        self._crash_point("release_after_mark")
        ids = res.group_ids()
        if any(not s.group_id for s in res.slots):  # cut short before ids were recorded
            ids |= await groups.ids_by_name(self._io, {s.group_name for s in res.slots})
        timeout = self.settings.removal_timeout
        left = await groups.remove_verified(self._io, ids, timeout)
        self._crash_point("release_after_remove")
        if left:
            why = f"Ray still reports placement group(s) {sorted(left)}; retrying"
            await self._commit(msgspec.structs.replace(res, reason=why))
            raise ReservationError(
                f"release of {job!r} is not complete: Ray still reports placement group(s) "
                f"{sorted(left)} after {timeout:g}s; placectl keeps removing "
                "them and drops the reservation once they are gone"
            )
        await self._forget(job)
        log.info("released %r", job)
        return True

    async def release(self, job: str) -> bool:
        """Remove ``job``'s groups and record; True if there was one. Idempotent. A
        ``reserve`` of the same job still in progress is cancelled first. Returns only
        once Ray reports every group gone."""
        await self._ready()
        job = check_job(job)
        task = self._reserving.get(job)
        if task is not None:
            task.cancel()
        async with self._lock(job):
            return await self._release_locked(job) or task is not None

    async def release_all(self) -> list[str]:
        """Release every reservation; returns the jobs released."""
        await self._ready()
        done = []
        for job in sorted(self._records):
            if await self.release(job):
                done.append(job)
        return done
