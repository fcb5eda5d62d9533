"""Recovery and the reconcile loop (a mixin of PlacementController).

A tick reads only what changed: Ray's node events (pushed by the GCS), and the groups of
the jobs on the nodes that changed. Every ``settings.full_check_period`` it reads every node and
every group of every reservation, which catches what no event reports (a group removed
behind placectl's back). Warm-up touches only nodes where a reservation may land.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from controller.errors import TableUnreadable
from controller.runtime import groups
from controller.runtime.io import REMOVED, GroupInfo, NodeInfo
from controller.state.records import (
    AUTO,
    DEGRADED,
    MANUAL,
    PENDING,
    READY,
    RELEASING,
    ReservationRecord,
    with_dead_nodes,
)

log = logging.getLogger("placectl.controller")


class Reconciling:
    """Recovery on start, then a tick every ``settings.reconcile_period``."""

    def _init_reconciling(self) -> None:
        self._alive: set[str] = set()
        self._node_info: dict[str, NodeInfo] = {}
        self._nodes_version = 0  # grows whenever _node_info changes
        self._by_node: dict[str, set[str]] = {}
        self._recheck: set[str] = set()
        self._joined = False  # a node joined since the last tick
        self._wakeup = asyncio.Event()  # a call found work for the loop: tick now
        self._last_full = 0.0
        self._last_load_try = 0.0
        self._warmed: dict[str, float] = {}
        self._background: set[asyncio.Task] = set()
        self._finishing: set[str] = set()
        self._sweeping = False  # an orphan removal runs in the background
        self._held_names: set[str] = set()  # group names and ids the records reference
        self._held_ids: set[str] = set()
        self.tick_stats: dict[str, float] = {}

    def _index(
        self, job: str, old: ReservationRecord | None, new: ReservationRecord | None
    ) -> None:
        for node in old.node_ids() if old else ():
            jobs = self._by_node.get(node)
            if jobs is not None:
                jobs.discard(job)
                if not jobs:
                    del self._by_node[node]
        for node in new.node_ids() if new else ():
            self._by_node.setdefault(node, set()).add(job)
        for record, held in ((old, False), (new, True)):  # what the orphan sweep keeps
            for s in record.slots if record else ():
                for mine, value in ((self._held_names, s.group_name), (self._held_ids, s.group_id)):
                    if held:
                        mine.add(value)
                    else:
                        mine.discard(value)

    def _set_nodes(self, infos: list[NodeInfo]) -> bool:
        """Take a full node list; True if a node joined since the last one."""
        alive = {n.node_id for n in infos if n.alive}
        joined = bool(alive - self._alive) and bool(self._node_info)
        self._alive = alive
        self._node_info = {n.node_id: n for n in infos}
        self._nodes_version += 1
        return joined

    def _node_died(self, node_id: str) -> None:
        self._alive.discard(node_id)
        info = self._node_info.get(node_id)
        if info is not None and info.alive:
            self._node_info[node_id] = msgspec.structs.replace(info, alive=False)
            self._nodes_version += 1

    async def _drain_events(self) -> None:
        """Take Ray's node events: the alive set follows them, and the jobs on a node
        that changed are checked at the next tick."""
        for event in await self._io.node_events():
            if event.alive:
                self._alive.add(event.node_id)
                self._joined = True
            else:
                self._node_died(event.node_id)
            self._recheck.update(self._by_node.get(event.node_id, ()))

    async def _idle(self) -> None:
        """Wait for the next tick: ``settings.reconcile_period``, or less when a node
        event arrives or a call found work (a lost node is acted on at once)."""
        period = self.settings.reconcile_period
        waits = {
            asyncio.ensure_future(self._io.wait_for_events(period)),
            asyncio.ensure_future(self._wakeup.wait()),
        }
        try:
            await asyncio.wait(waits, timeout=period, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            self._wakeup.clear()

    async def _confirm(self, jobs) -> None:
        """Make what the controller answers about ``jobs`` agree with Ray right now.

        Node events that arrived are taken, and the nodes these jobs hold are asked of
        Ray directly (one round trip for all of them), so no call answers ``ready`` for
        a reservation on a node Ray reports dead, even in the moment before the loop
        has seen the event. A job found on a dead node is recorded degraded here when
        no other call holds it (else the answer says so, see :meth:`_truthful`), and
        the loop is woken to repair it.
        """
        await self._drain_events()
        held = [self._records[j] for j in jobs if j in self._records and self._records[j].settled]
        nodes = sorted({n for r in held for n in r.node_ids()})
        if not nodes:
            return
        dead = await self._io.dead_nodes(nodes)
        for node in nodes:
            if node in dead:
                self._node_died(node)
            else:
                self._alive.add(node)  # Ray's answer is newer than any event we hold
        for res in held:
            if res.node_ids() <= self._alive:
                continue
            self._recheck.add(res.job)
            self._wakeup.set()
            if res.state == READY and not self._lock(res.job).locked():
                await self._check(res.job, await self._io.groups(sorted(res.group_ids())))

    def _truthful(self, res: ReservationRecord) -> ReservationRecord:
        """``res`` as it stands with the nodes the controller knows dead."""
        return with_dead_nodes(res, res.node_ids() - self._alive)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------ recovery
    async def _recover(self) -> None:
        """Reload the table and bring it in line with Ray (see the class contract).

        Raises:
            TableUnreadable: nothing was changed; the controller refuses to act.
        """
        await self._io.node_events()  # subscribe first: no death between read and watch
        loaded = await self._store.load()
        self._records, self._epochs = {}, dict(loaded.epochs)
        self._plans.clear()
        self._published.clear()
        self._encoded.clear()
        self._by_node.clear()
        self._held_names.clear()
        self._held_ids.clear()
        for job, res in loaded.records.items():
            self._records[job] = res
            self._index(job, None, res)
        self._set_nodes(await self._io.nodes())
        table = await self._io.groups()
        for job in sorted(self._records):
            res = self._records[job]
            if res.applying is not None:
                log.warning("rolling back an apply to %r cut short by a restart", job)
                res = msgspec.structs.replace(res, applying=None)
                await self._commit(res)  # its groups are orphans now
            if res.state in (PENDING, RELEASING):
                log.warning("finishing %s reservation %r cut short by a restart", res.state, job)
                try:
                    await self._release_locked(job)
                except Exception as e:
                    log.warning("could not finish releasing %r yet: %s", job, e)
            else:
                await self._check(job, table)
        await self._remove_orphans(table)
        self._refusal = None
        self._last_full = time.monotonic()
        self._observe()
        log.info(
            "recovered %d reservation(s)%s",
            len(self._records),
            f", {loaded.migrated} migrated from table format 1" if loaded.migrated else "",
        )

    def _orphans(self, table: dict[str, GroupInfo]) -> set[str]:
        """Live groups with this controller's prefix that no record names: left by a call
        cut short, or by a removal Ray did not confirm in time. Groups a repair is making
        right now are not orphans."""
        making = {n for made in self._making.values() for n in made}
        for r in self._records.values():
            if r.applying is not None:  # an apply is making them
                making.update(r.applying.group_names)
        return {
            gid
            for gid, info in table.items()
            if gid not in self._held_ids
            and info.state != REMOVED
            and info.name.startswith(self._prefix)
            and info.name not in self._held_names
            and info.name not in making
        }

    async def _remove_orphans(self, table: dict[str, GroupInfo]) -> None:
        orphans = self._orphans(table)
        if orphans:
            log.warning("removing %d orphaned placement groups: %s", len(orphans), sorted(orphans))
            left = await groups.remove_verified(self._io, orphans, self.settings.removal_timeout)
            if left:
                log.warning("orphans not removed yet: %s", sorted(left))

    async def _remove(self, orphans: set[str]) -> None:
        try:
            await self._remove_orphans(await self._io.groups(sorted(orphans)))
        except Exception as e:
            log.info("removing orphans: %s", e)
        finally:
            self._sweeping = False

    # ------------------------------------------------------------ ticks
    async def _tick(self) -> None:
        started, cpu = time.perf_counter(), time.process_time()
        now = time.monotonic()
        if self._refusal is not None:
            if now - self._last_load_try >= self.settings.refusal_retry:
                self._last_load_try = now
                try:
                    await self._recover()
                    log.warning("the reservation table is readable again; acting on it")
                except TableUnreadable as e:
                    self._refuse(str(e))
            return
        await self._drain_events()
        joined, self._joined = self._joined, False
        full = now - self._last_full >= self.settings.full_check_period
        if full or joined:
            joined = self._set_nodes(await self._io.nodes()) or joined
        if full:
            self._last_full = now
            jobs = set(self._records)
        else:
            jobs = set(self._recheck)
        jobs = {j for j in jobs if j in self._records and self._records[j].settled}
        self._recheck.clear()
        if jobs:
            ids = sorted(g for j in jobs for g in self._records[j].group_ids())
            table = await self._io.groups(None if full else ids)
            for job in sorted(jobs):
                await self._check(job, table)
        if full and not self._sweeping:
            orphans = self._orphans(await self._io.groups() if not jobs else table)
            if orphans:
                self._sweeping = True
                self._spawn(self._remove(orphans))
        self._follow_up(joined)
        self._warm_nodes()
        self.tick_stats = {
            "wall_s": time.perf_counter() - started,
            "cpu_s": time.process_time() - cpu,
            "jobs_checked": len(jobs),
            "full": float(full),
        }

    async def _check(self, job: str, table: dict[str, GroupInfo]) -> None:
        """Mark a settled reservation ready or degraded by what Ray reports."""
        res = self._records.get(job)
        if res is None or not res.settled:
            return
        if self._lock(job).locked():
            self._recheck.add(job)  # a call is changing it; look again next tick
            return
        found = groups.problems(res, table, self._alive)
        state, reason = (DEGRADED, "; ".join(found)) if found else (READY, "")
        if state == res.state == DEGRADED:
            return  # while degraded, the repair owns the reason
        if state == DEGRADED and res.repair == MANUAL:
            reason += f"; repair policy is manual: run `placectl repair {job}`"
        if (state, reason) == (res.state, res.reason):
            return
        try:
            await self._commit(msgspec.structs.replace(res, state=state, reason=reason))
        except Exception as e:
            self._recheck.add(job)  # memory is unchanged: try again next tick
            log.warning("could not record that %r is %s: %s", job, state, e)
            return
        log.warning("reservation %r is now %s %s", job, state, reason)

    def _follow_up(self, joined: bool) -> None:
        if joined:
            self._repair_after.clear()  # a spare may have arrived: try at once
        for job, res in list(self._records.items()):
            if self._lock(job).locked() or job in self._reserving:
                continue
            if res.applying is not None:  # an apply that could not clear its intent
                self._spawn(self._clear_intent(job))
            elif res.state == DEGRADED and res.repair == AUTO:
                self._schedule_repair(job)
            elif res.state in (PENDING, RELEASING) and job not in self._finishing:
                self._finishing.add(job)
                self._spawn(self._finish_release(job))

    async def _clear_intent(self, job: str) -> None:
        async with self._lock(job):
            res = self._records.get(job)
            if res is not None and res.applying is not None:
                try:
                    await self._commit(msgspec.structs.replace(res, applying=None))
                except Exception as e:
                    log.info("clearing the apply intent of %r: %s", job, e)

    async def _finish_release(self, job: str) -> None:
        try:
            async with self._lock(job):
                res = self._records.get(job)
                if res is not None and res.state in (PENDING, RELEASING):
                    await self._release_locked(job)
        except Exception as e:
            log.info("finishing the release of %r: %s", job, e)
        finally:
            self._finishing.discard(job)

    def _warm_nodes(self) -> None:
        # One idle worker per node answers that node's probes; starting it off the
        # reserve path saves a worker start per node. Only nodes with something left to
        # reserve are warmed, at most warm_budget per tick, each once per warm_period.
        now = time.monotonic()
        period = self.settings.warm_period
        held: dict[str, int] = {}
        for res in self._records.values():
            for slot in res.slots:
                held[slot.node_id] = held.get(slot.node_id, 0) + len(slot.bundles)
        budget = self.settings.warm_budget
        for node_id in sorted(self._alive, key=lambda n: self._warmed.get(n, 0.0)):
            if budget == 0 or now - self._warmed.get(node_id, -period) < period:
                break
            info = self._node_info.get(node_id)
            if info is None or not _reservable(info, held.get(node_id, 0)):
                continue
            self._io.warm(node_id)
            self._warmed[node_id] = now
            budget -= 1


def _reservable(info: NodeInfo, bundles_held: int) -> bool:
    """Whether a new reservation could still use the node: it has accelerators or custom
    resources that placectl's own bundles do not already fill."""
    units = sum(
        v
        for k, v in info.resources.items()
        if k not in ("CPU", "memory", "object_store_memory")
        and not k.startswith(("node:", "accelerator_type:"))
    )
    return units > bundles_held
