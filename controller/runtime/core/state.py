"""The one owner of the controller's state: its in-memory mirror of the reservation table.

Everything the controller knows of its reservations lives here: the records, the highest
epoch of every job name, each job's plan and published assignments (and their encoded
form, for the read path), and what follows from the records: the port and core ledgers
of every node, the jobs on every node, the group names and ids no orphan sweep may touch, the
counts by state that metrics report.

The only way to change any of it is :meth:`ReservationState.commit` (or
:meth:`~ReservationState.forget`), which writes the change to the GCS through the
:class:`~controller.runtime.core.store.Store` first and applies it in memory only once the
write succeeded: intent first, enforced here instead of by every operation. A commit
names the record it was built from and is refused unless that record is still current
and no other write of the job is under way, so two writers of one job can never lose
each other's change silently (see :mod:`controller.runtime.core.stewards` for who writes when).
Reads return frozen records and read-only mappings.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import types
from collections.abc import Mapping

import msgspec

from controller.errors import ReservationError, StaleChange, UnknownReservation
from controller.runtime.core import Tasks
from controller.runtime.core.history import History
from controller.runtime.core.store import Loaded, Store
from controller.runtime.edge import Metrics
from controller.state.events import Event, cordon_set, operator_set, quota_set
from controller.state.published import Published
from controller.state.records import STATES, Cordon, ReservationRecord
from controller.state.requests import check_job
from controller.state.table import StoredPlan

log = logging.getLogger("placectl.controller")


class ReservationState:
    """The controller's mirror of the table (see the module docstring).

    Args:
        store: the table in the GCS; every change goes through it first.
        metrics: where the counts by state go.
        history: told every change, and written to the table a moment after it.
        tasks: where that write runs (None: only when :meth:`write_history` is awaited).
    """

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        history: History | None = None,
        tasks: Tasks | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._history = history or History(metrics)
        self._tasks = tasks
        self._records: dict[str, ReservationRecord] = {}
        self._view = types.MappingProxyType(self._records)
        self._epochs: dict[str, int] = {}
        self._plans: dict[str, StoredPlan] = {}
        self._published: dict[str, Published] = {}
        self._encoded: dict[str, dict[str, bytes]] = {}
        self._states: dict[str, int] = dict.fromkeys(STATES, 0)
        self._ledger: dict[str, collections.Counter] = {}  # node id -> leased ports
        self._cores: dict[str, collections.Counter] = {}  # node id -> leased CPU units
        self._by_node: dict[str, set[str]] = {}  # node id -> jobs with a slot there
        self._held_names: set[str] = set()  # group names and ids the records reference
        self._held_ids: set[str] = set()
        self._quotas: dict[str, dict[str, float]] = {}
        self._operator = ""
        self._cordons: dict[str, Cordon] = {}
        self._kept_from = 1  # the lowest event number that may still be stored
        self._writing: set[str] = set()  # jobs whose change is being written now
        self.bytes_written = 0

    # ------------------------------------------------------------ reads
    @property
    def records(self) -> Mapping[str, ReservationRecord]:
        """Every record, by job name (read-only; records are frozen)."""
        return self._view

    def get(self, job: str) -> ReservationRecord | None:
        return self._records.get(job)

    def require(self, job: str) -> ReservationRecord:
        """``job``'s record.

        Raises:
            UnknownReservation: there is none; the message lists what is reserved.
        """
        check_job(job)
        res = self._records.get(job)
        if res is None:
            known = ", ".join(sorted(self._records)) or "none"
            raise UnknownReservation(f"no reservation named {job!r} (reserved: {known})")
        return res

    @property
    def history(self) -> History:
        """What happened, told by the commits (read it; it is fed here only)."""
        return self._history

    @property
    def quotas(self) -> Mapping[str, Mapping[str, float]]:
        """Each queue's quota: resource -> most its admitted reservations may hold."""
        return types.MappingProxyType(self._quotas)

    @property
    def operator(self) -> str:
        """The hash of the operator's token ("" when none is set)."""
        return self._operator

    async def set_operator(self, hashed: str) -> None:
        """Store the hash of the operator's token (written to the table first)."""
        await self._store.write_operator(hashed)
        self._operator = hashed
        self._history.add(operator_set(hashed))
        self._write_history_soon()

    def told(self, event: Event) -> None:
        """Something that happened beside any record (a node fenced, placectl's calls
        refused): kept in the history with the rest."""
        self._history.add(event)
        self._write_history_soon()

    @property
    def cordons(self) -> Mapping[str, Cordon]:
        """The nodes an operator took out of placement: node id -> its cordon."""
        return types.MappingProxyType(self._cordons)

    async def set_cordon(self, node_id: str, cordon: Cordon | None, what: str) -> None:
        """Store a node's cordon (written to the table first); ``None`` lifts it.
        ``what`` is the history's line."""
        await self._store.write_cordon(node_id, cordon)
        if cordon is not None:
            self._cordons[node_id] = cordon
        else:
            self._cordons.pop(node_id, None)
        self._history.add(cordon_set(what))
        self._write_history_soon()

    async def set_quota(self, queue: str, limits: dict[str, float]) -> None:
        """Store a queue's quota (written to the table first); empty removes it."""
        await self._store.write_quota(queue, limits)
        if limits:
            self._quotas[queue] = dict(limits)
        else:
            self._quotas.pop(queue, None)
        self._history.add(quota_set(queue, limits))
        self._write_history_soon()

    def epoch(self, job: str) -> int:
        """The highest epoch ``job`` ever had (kept after a release)."""
        return self._epochs.get(job, 0)

    def jobs_on(self, node_id: str) -> frozenset[str]:
        return frozenset(self._by_node.get(node_id, ()))

    def ports_leased(self, node_id: str) -> set[int]:
        """The ports the records lease on a node."""
        return set(self._ledger.get(node_id, ()))

    def cores_leased(self, node_id: str) -> set[int]:
        """The CPU units the records lease on a node."""
        return set(self._cores.get(node_id, ()))

    def references(self, group_name: str, group_id: str) -> bool:
        """Whether a record names this group (an orphan sweep must leave it)."""
        return group_id in self._held_ids or group_name in self._held_names

    async def plan(self, job: str) -> StoredPlan:
        plan = self._plans.get(job)
        if plan is None:
            plan = await self._store.plan(job)
            if plan is None:
                raise ReservationError(f"the plan of {job!r} is missing from the table")
            self._plans[job] = plan
        return plan

    async def published(self, job: str) -> Published:
        """The assignments of ``job``'s current uid and epoch."""
        published = self._published.get(job)
        record = self._records[job]
        if published is None or published.epoch != record.epoch or published.uid != record.uid:
            published = await self._store.published(record)
            if published is None or published.uid != record.uid:
                raise ReservationError(f"the assignments of {job!r} are missing from the table")
            self._published[job] = published
        return published

    async def encoded(self, job: str) -> dict[str, bytes]:
        """Each component's assignments of ``job``, msgpack-encoded (cached)."""
        encoded = self._encoded.get(job)
        if encoded is None:
            published = await self.published(job)
            encoded = {
                n: msgspec.msgpack.encode(b.assignments()) for n, b in published.components.items()
            }
            self._encoded[job] = encoded
        return encoded

    # ------------------------------------------------------------ changes
    async def commit(
        self,
        record: ReservationRecord,
        *,
        base: ReservationRecord | None,
        plan: StoredPlan | None = None,
        published: Published | None = None,
    ) -> None:
        """Write ``record`` (and what changed with it), then make it current in memory.

        Args:
            record: the job's new record.
            base: the record the change was built from (None: the job had none). It
                must still be the job's current record, with no other write of the job
                under way: a change never lands on top of one it did not see.

        Raises:
            StaleChange: ``base`` is not current, or another change is being written;
                nothing was written.
            PersistenceError: the write failed; nothing changed.
        """
        job = record.job
        self._check_base(job, base)
        self._writing.add(job)
        try:
            if plan is None and published is None and record.epoch == self._epochs.get(job):
                self.bytes_written += await self._store.write_record(record)
            else:
                self.bytes_written += await self._store.write(record, plan, published)
        finally:
            self._writing.discard(job)
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
        self._history.changed(old, record)
        self._write_history_soon()

    def _check_base(self, job: str, base: ReservationRecord | None) -> None:
        current = self._records.get(job)
        if job in self._writing or current is not base:
            what = "is being written by another change" if job in self._writing else "changed"
            raise StaleChange(
                f"reservation {job!r} {what} while this change to it was being made; "
                "nothing was written (a controller bug: report it)"
            )

    async def forget(self, job: str) -> None:
        """Delete ``job``'s record and what hangs off it (its epoch counter stays).

        Raises:
            StaleChange: another change of ``job`` is being written; nothing was deleted.
        """
        self._check_base(job, self._records.get(job))
        if job in self._records:
            self._writing.add(job)
            try:
                await self._store.delete(self._records[job])
            finally:
                self._writing.discard(job)
        old = self._records.pop(job, None)
        self._plans.pop(job, None)
        self._published.pop(job, None)
        self._encoded.pop(job, None)
        self._index(job, old, None)
        self._account(old, None)
        if old is not None:
            self._history.changed(old, None)
            self._write_history_soon()

    # ------------------------------------------------------------ history
    def _write_history_soon(self) -> None:
        if self._tasks is not None:
            self._tasks.start("history", "write", self._write_history_until_done())

    async def _write_history_until_done(self) -> None:
        await asyncio.sleep(0)  # the events of one change go out together
        while True:
            try:
                if not await self.write_history():
                    return
            except Exception as e:
                log.warning("writing the event history failed (%s); retrying", e)
                await asyncio.sleep(1.0)

    async def write_history(self) -> bool:
        """Write the events not written yet and delete those no longer kept; False when
        there was nothing to write."""
        batch = self._history.unwritten()
        if not batch:
            return False
        try:
            await self._store.write_events(batch)
        except BaseException:
            self._history.unwrite(batch)
            raise
        keep_from = batch[-1].seq - self._history.limit + 1
        if keep_from > self._kept_from:
            await self._store.delete_events(self._kept_from, keep_from)
            self._kept_from = keep_from
        return True

    async def drop_components(self, job: str, components: list[str]) -> None:
        """Delete the stored assignments of components ``job`` no longer has."""
        await self._store.delete_components(job, components)

    async def load(self) -> Loaded:
        """Replace everything with the table as stored (recovery).

        Raises:
            TableUnreadable: nothing was changed, in the table or here.
        """
        loaded = await self._store.load()
        self._records.clear()
        self._records.update(loaded.records)
        self._epochs = dict(loaded.epochs)
        self._quotas = {q: dict(v) for q, v in loaded.quotas.items()}
        self._operator = loaded.operator
        self._cordons = dict(loaded.cordons)
        for cache in (self._plans, self._published, self._encoded, self._by_node):
            cache.clear()
        self._held_names.clear()
        self._held_ids.clear()
        self._states = dict.fromkeys(STATES, 0)
        self._ledger, self._cores = {}, {}
        for job, res in self._records.items():
            self._index(job, None, res)
            self._account(None, res, report=False)
        self._metrics.observe(self._states)
        events, highest, lowest = await self._store.load_events()
        self._history.restore(events, highest)
        self._kept_from = lowest
        return loaded

    # ------------------------------------------------------------ derived
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
        for record, held in ((old, False), (new, True)):
            names = {s.group_name for s in (*record.slots, *record.spares)} if record else set()
            ids = record.group_ids() if record else set()  # leaving groups included
            for mine, values in ((self._held_names, names), (self._held_ids, ids)):
                (mine.update if held else mine.difference_update)(values)

    def _account(
        self, old: ReservationRecord | None, new: ReservationRecord | None, report: bool = True
    ) -> None:
        """Keep state counts and the port and core ledgers in step with one record's
        change, so a commit costs what its job costs, not what the cluster holds."""
        for record, sign in ((old, -1), (new, 1)):
            if record is None:
                continue
            self._states[record.state] = self._states.get(record.state, 0) + sign
            for ledger, node_id, numbers in [
                *((self._ledger, x.node_id, x.ports) for x in record.leases),
                *((self._cores, x.node_id, x.units()) for x in record.cores),
            ]:
                held = ledger.setdefault(node_id, collections.Counter())
                for n in numbers:
                    held[n] += sign
                    if held[n] <= 0:
                        del held[n]
        if report:
            self._metrics.observe(self._states)
