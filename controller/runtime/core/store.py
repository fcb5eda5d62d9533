"""The reservation table in the GCS key-value store, read and written through the
cluster-I/O interface (layout and versions: :mod:`controller.state.table`).

The event history kept beside the table: :mod:`controller.runtime.core.history`.
"""

from __future__ import annotations

import logging

import msgspec

from controller.errors import PersistenceError, TableUnreadable
from controller.runtime.edge import ClusterIO
from controller.state.events import Event
from controller.state.published import ComponentBlock, Published
from controller.state.records import Cordon, ReservationRecord
from controller.state.table import (
    CORDON,
    EPOCH,
    EVENT,
    LEGACY_BACKUP,
    LEGACY_KEY,
    META,
    OPERATOR,
    PLAN,
    QUOTA,
    RECORD,
    StoredPlan,
    check_meta,
    component_key,
    decode,
    encode,
    event_key,
    job_of,
    key,
    meta_bytes,
    migrate_v1,
)

log = logging.getLogger("placectl.controller")


def _seq_of(k: bytes) -> int:
    tail = k[len(EVENT) :]
    return int(tail) if tail.isdigit() else 0


MAX_PROBLEMS_SHOWN = 3


class Loaded(msgspec.Struct):
    records: dict[str, ReservationRecord]
    epochs: dict[str, int]
    migrated: int = 0
    quotas: dict[str, dict[str, float]] = {}
    operator: str = ""  # the hash of the operator's token ("" when none is set)
    cordons: dict[str, Cordon] = {}  # node id -> why it takes no new slot


class Store:
    """Reads and writes the table. Every write either completes or raises
    :class:`PersistenceError`; callers change memory only after it returns."""

    def __init__(self, io: ClusterIO) -> None:
        self.io = io

    async def _put(self, k: bytes, value: bytes) -> None:
        try:
            await self.io.kv_put(k, value)
        except Exception as e:
            raise PersistenceError(f"writing {k.decode()!r} to the GCS failed: {e}") from e

    async def _delete(self, k: bytes) -> None:
        try:
            await self.io.kv_delete(k)
        except Exception as e:
            raise PersistenceError(f"deleting {k.decode()!r} from the GCS failed: {e}") from e

    # ------------------------------------------------------------ loading
    async def load(self) -> Loaded:
        """Every record and epoch counter; migrates a format-1 table first.

        Raises:
            TableUnreadable: the table (or any record in it) was written by a newer
                placectl or cannot be decoded. Nothing is changed then.
        """
        meta = await self.io.kv_get(META)
        check_meta(meta)
        migrated = 0
        if meta is None:
            legacy = await self.io.kv_get(LEGACY_KEY)
            if legacy is not None:
                migrated = await self._migrate(legacy)
            else:
                await self._put(META, meta_bytes())
        keys = await self.io.kv_keys(RECORD)
        data = await self.io.kv_multi_get(keys)
        records: dict[str, ReservationRecord] = {}
        problems = []
        for k in sorted(data):
            try:
                record = decode(data[k], ReservationRecord, f"record {k.decode()!r}")
            except TableUnreadable as e:
                problems.append(str(e))
                continue
            records[record.job] = record
        if problems:
            more = len(problems) - MAX_PROBLEMS_SHOWN
            raise TableUnreadable(
                "; ".join(problems[:MAX_PROBLEMS_SHOWN])
                + (f"; and {more} more" if more > 0 else "")
            )
        epoch_keys = await self.io.kv_keys(EPOCH)
        epochs = {}
        for k, v in (await self.io.kv_multi_get(epoch_keys)).items():
            try:
                epochs[job_of(k, EPOCH)] = int(msgspec.msgpack.decode(v))
            except (msgspec.DecodeError, TypeError, ValueError):
                raise TableUnreadable(f"epoch counter {k.decode()!r} is not an int") from None
        for job, r in records.items():
            epochs[job] = max(epochs.get(job, 0), r.epoch)
        quotas = {}
        for k, v in (await self.io.kv_multi_get(await self.io.kv_keys(QUOTA))).items():
            quotas[job_of(k, QUOTA)] = decode(v, dict[str, float], f"quota {k.decode()!r}")
        stored = await self.io.kv_get(OPERATOR)
        operator = decode(stored, str, "operator token hash") if stored is not None else ""
        cordons = {}
        for k, v in (await self.io.kv_multi_get(await self.io.kv_keys(CORDON))).items():
            cordons[job_of(k, CORDON)] = decode(v, Cordon, f"cordon {k.decode()!r}")
        return Loaded(records, epochs, migrated, quotas, operator, cordons)

    async def _migrate(self, legacy: bytes) -> int:
        migrated = migrate_v1(legacy)  # TableUnreadable if it is not a format-1 table
        for m in migrated:
            await self.write(m.record, m.plan, m.published)
        await self._put(LEGACY_BACKUP, legacy)
        await self._put(META, meta_bytes())
        await self._delete(LEGACY_KEY)
        log.warning("migrated %d reservation(s) from table format 1", len(migrated))
        return len(migrated)

    async def plan(self, job: str) -> StoredPlan | None:
        data = await self.io.kv_get(key(PLAN, job))
        return None if data is None else decode(data, StoredPlan, f"plan of {job!r}")

    async def published(self, record: ReservationRecord) -> Published | None:
        """The stored assignments of every component of ``record`` (None if any is
        missing)."""
        keys = [component_key(record.job, c) for c in record.world_sizes]
        data = await self.io.kv_multi_get(keys)
        if len(data) != len(keys):
            return None
        blocks = {
            c: decode(data[k], ComponentBlock, f"assignments of {record.job}/{c}")
            for c, k in zip(record.world_sizes, keys, strict=True)
        }
        first = next(iter(blocks.values()), None)
        uid, epoch = (first.uid, first.epoch) if first else (record.uid, record.epoch)
        return Published(job=record.job, uid=uid, epoch=epoch, components=blocks)

    # ------------------------------------------------------------ writing
    async def write(
        self,
        record: ReservationRecord,
        plan: StoredPlan | None = None,
        published: Published | None = None,
    ) -> int:
        """Write what changed, the record last (readers trust the record); returns the
        bytes written."""
        written = 0
        items = [(key(EPOCH, record.job), encode(record.epoch))]
        if plan is not None:
            items.append((key(PLAN, record.job), encode(plan)))
        if published is not None:
            for name, block in published.components.items():
                items.append((component_key(record.job, name), encode(block)))
        items.append((key(RECORD, record.job), encode(record)))
        for k, v in items:
            await self._put(k, v)
            written += len(k) + len(v)
        return written

    async def write_record(self, record: ReservationRecord) -> int:
        """Write only the record (a state change that moves no assignment)."""
        k, v = key(RECORD, record.job), encode(record)
        await self._put(k, v)
        return len(k) + len(v)

    async def write_quota(self, queue: str, limits: dict[str, float]) -> None:
        """Store a queue's quota; an empty one removes it."""
        if limits:
            await self._put(key(QUOTA, queue), encode(limits))
        else:
            await self._delete(key(QUOTA, queue))

    async def write_cordon(self, node_id: str, cordon: Cordon | None) -> None:
        """Store a node's cordon; ``None`` removes it."""
        if cordon is not None:
            await self._put(key(CORDON, node_id), encode(cordon))
        else:
            await self._delete(key(CORDON, node_id))

    async def write_operator(self, hashed: str) -> None:
        """Store the hash of the operator's token."""
        await self._put(OPERATOR, encode(hashed))

    async def write_events(self, events: list[Event]) -> None:
        """Write events of the history (each under its number)."""
        for event in events:
            await self._put(event_key(event.seq), encode(event))

    async def delete_events(self, first: int, below: int) -> None:
        """Delete the stored events numbered ``first`` up to ``below`` (excluded), by key:
        no listing, so trimming the history costs what it deletes."""
        for seq in range(max(first, 1), below):
            await self._delete(event_key(seq))

    async def load_events(self) -> tuple[list[Event], int, int]:
        """The stored history, oldest first, and the highest and lowest numbers stored
        (0, 1 when none is). An event
        that cannot be decoded (a newer placectl's) is skipped: history never stops a
        controller from starting."""
        keys = sorted(await self.io.kv_keys(EVENT))
        data = await self.io.kv_multi_get(keys) if keys else {}
        events = []
        for k, v in data.items():
            try:
                events.append(msgspec.msgpack.decode(v, type=Event))
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("skipping the unreadable event %r", k)
        events.sort(key=lambda e: e.seq)
        seqs = [_seq_of(k) for k in keys]
        return events, max(seqs, default=0), min(seqs, default=1)

    async def delete_components(self, job: str, components: list[str]) -> None:
        """Remove the stored assignments of components a record no longer has."""
        for component in components:
            await self._delete(component_key(job, component))

    async def delete(self, record: ReservationRecord) -> None:
        """Forget a released job: the record first, then what hangs off it. The epoch
        counter stays, so the name's next reservation continues the count."""
        await self._delete(key(RECORD, record.job))
        for component in record.world_sizes:
            await self._delete(component_key(record.job, component))
        await self._delete(key(PLAN, record.job))


__all__ = ["Loaded", "Store"]
