"""The storage format of the reservation table in the GCS key-value store.

One key per record, so a write costs what its job costs, whatever else the cluster
holds. In the GCS namespace ``placectl``, every key starts with the controller's name
and a colon (``placectl:res/grpo``); below, keys are shown without it:

=================  =========================================================
``meta``           ``{"format": 2}``: the layout of the keys below
``res/<job>``      the :class:`ReservationRecord`
``plan/<job>``     the :class:`StoredPlan` (the controller's own copy of the plan)
``asg/<job>/<c>``  component ``c``'s assignments of the record's epoch
                   (:class:`~controller.state.published.ComponentBlock`)
``epoch/<job>``    the last epoch the job name used (kept after release)
=================  =========================================================

Format 1 (placectl 0.1) kept the whole table under one key, ``reservations``; it is
migrated on start (:func:`migrate_v1`). A record or format this placectl does not know
(written by a newer one) or cannot decode is reported by :class:`TableUnreadable`, never
read as empty.
"""

from __future__ import annotations

import re
import threading
from typing import Any, TypeVar

import msgspec

from controller.errors import PlacementError, TableUnreadable
from controller.planning.cluster import ClusterView
from controller.planning.components import ComponentPlacement
from controller.planning.spec import ClusterSpec
from controller.state.leases import PortLease
from controller.state.plan import JobPlan
from controller.state.published import Published, publish
from controller.state.records import SCHEMA_VERSION, ReservationRecord, SlotRecord

FORMAT = 2
META = b"meta"
LEGACY_KEY = b"reservations"
LEGACY_BACKUP = b"reservations.v1-migrated"
RECORD, PLAN, ASSIGNMENTS, EPOCH = b"res/", b"plan/", b"asg/", b"epoch/"
QUOTA = b"quota/"  # + queue name: {resource: limit}
CORDON = b"cordon/"  # + node id: a Cordon (controller.state.records)
EVENT = b"event/"  # + seq, zero-padded so that keys sort in order: one Event
OPERATOR = b"operator"  # the hash of the operator's token, who may change quotas
T = TypeVar("T")


KV_NAMESPACE = "placectl"


def kv_prefix(controller_name: str) -> bytes:
    """What every key of a controller's table starts with in namespace ``placectl``.

    The GCS splits a namespace from its key at the first colon, so the namespace itself
    must hold none; placectl 0.1's namespace ``placectl:<name>`` with key ``reservations``
    lands on exactly the key ``<name>:reservations`` here, which is how the format-1
    table is found.
    """
    return f"{controller_name}:".encode()


def where(controller_name: str) -> str:
    """Where the table lives, for messages."""
    return f"GCS namespace {KV_NAMESPACE!r}, keys {controller_name + ':*'!r}"


def key(prefix: bytes, job: str) -> bytes:
    return prefix + job.encode()


def event_key(seq: int) -> bytes:
    return EVENT + f"{seq:012d}".encode()


def component_key(job: str, component: str) -> bytes:
    """The key of one component's assignments (names hold no '/')."""
    return ASSIGNMENTS + f"{job}/{component}".encode()


class _Head(msgspec.Struct):
    v: int = 0


def job_of(k: bytes, prefix: bytes) -> str:
    return k[len(prefix) :].decode()


class StoredPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The plan of one reservation identity (uid) as of an epoch."""

    v: int = SCHEMA_VERSION
    job: str
    uid: str
    epoch: int
    plan: JobPlan


def encode(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


_DECODERS: dict[type, msgspec.msgpack.Decoder] = {}
_DECODERS_LOCK = threading.Lock()


def _decoder(typ: type[T]) -> msgspec.msgpack.Decoder:
    """The one decoder of ``typ``. msgspec builds a type's decoding information on its
    first use, and threads that do that at once can crash the process (seen: a driver
    launching worker groups from three threads); so it is built here, once, under a lock.
    """
    decoder = _DECODERS.get(typ)
    if decoder is None:
        with _DECODERS_LOCK:
            decoder = _DECODERS.get(typ)
            if decoder is None:
                decoder = _DECODERS[typ] = msgspec.msgpack.Decoder(typ)
    return decoder


def decode(data: bytes, typ: type[T], what: str) -> T:
    """Decode a versioned record; newer versions and undecodable bytes raise
    :class:`TableUnreadable` naming ``what`` and why. Safe from any thread."""
    try:  # the version alone: decoding skips the rest without building it
        version = _decoder(_Head).decode(data).v
    except msgspec.ValidationError:
        version = 0  # not a mapping: the typed decode below says what is wrong
    except msgspec.DecodeError as e:
        raise TableUnreadable(f"{what} is not valid msgpack ({e})") from None
    if version > SCHEMA_VERSION:
        raise TableUnreadable(
            f"{what} has schema version {version}, written by a newer placectl; this one "
            f"reads up to {SCHEMA_VERSION}"
        )
    try:
        return _decoder(typ).decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise TableUnreadable(f"{what} cannot be decoded ({e})") from None


def check_meta(data: bytes | None) -> None:
    """Raise TableUnreadable unless ``data`` is absent or a format this placectl reads."""
    if data is None:
        return
    try:
        meta = msgspec.msgpack.decode(data)
    except msgspec.DecodeError as e:
        raise TableUnreadable(f"table meta is not valid msgpack ({e})") from None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if not isinstance(fmt, int):
        raise TableUnreadable(f"table meta {meta!r} has no format number")
    if fmt > FORMAT:
        raise TableUnreadable(
            f"the table has format {fmt}, written by a newer placectl; this one reads up to "
            f"{FORMAT}"
        )


def meta_bytes() -> bytes:
    return encode({"format": FORMAT})


# ---------------------------------------------------------------- format 1
class _V1Record(msgspec.Struct, kw_only=True):
    job: str
    spec: ClusterSpec
    view: ClusterView
    floating: dict[str, list[int]] = {}
    slots: list[SlotRecord] = []
    state: str = "pending"
    epoch: int = 1
    created_at: float = 0.0
    reason: str = ""
    leases: list[PortLease] = []


class _V1Table(msgspec.Struct, kw_only=True):
    version: int = 1
    reservations: dict[str, _V1Record] = {}


class Migrated(msgspec.Struct, frozen=True):
    """One reservation of a format-1 table in today's records."""

    record: ReservationRecord
    plan: StoredPlan
    published: Published | None


_TOKEN = re.compile(r":([0-9a-f]+):\d+$")


def migrate_v1(data: bytes) -> list[Migrated]:
    """Today's records for a format-1 table (placectl 0.1's single ``reservations`` key).

    The plan is computed again from the stored spec and the full cluster view, exactly as
    0.1 computed it; the record keeps only the nodes it uses. A record gets a uid made
    from its group names, so that migrating twice gives the same records.

    Raises:
        TableUnreadable: the bytes are not a format-1 table.
    """
    try:
        head = msgspec.msgpack.decode(data)
        version = head.get("version") if isinstance(head, dict) else None
        if version != 1:
            raise TableUnreadable(f"legacy table has version {version!r}; expected 1")
        table = msgspec.msgpack.decode(data, type=_V1Table)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise TableUnreadable(f"legacy table cannot be decoded ({e})") from None
    out = []
    for job, old in sorted(table.reservations.items()):
        try:
            cp = ComponentPlacement(old.spec, old.view, old.floating)
        except PlacementError as e:
            raise TableUnreadable(f"legacy record {job!r} no longer plans: {e}") from None
        plan = JobPlan.of(cp)
        token = next((m.group(1) for s in old.slots if (m := _TOKEN.search(s.group_name))), "")
        used = {s.node_rank for s in old.slots} | set(plan.node_ranks())
        record = ReservationRecord(
            job=job,
            uid=f"v1-{token or job}",
            epoch=old.epoch,
            spec=old.spec,
            nodes={nr: old.view.nodes[nr] for nr in sorted(used)},
            floating=old.floating,
            slots=old.slots,
            world_sizes=plan.world_sizes(),
            state=old.state,
            reason=old.reason,
            created_at=old.created_at,
            leases=old.leases,
        )
        stored = StoredPlan(job=job, uid=record.uid, epoch=record.epoch, plan=plan)
        try:
            published = publish(record, plan) if record.settled else None
        except (KeyError, IndexError, PlacementError) as e:
            raise TableUnreadable(
                f"legacy record {job!r} cannot be migrated: its plan no longer matches its "
                f"slots ({type(e).__name__}: {e})"
            ) from None
        out.append(Migrated(record, stored, published))
    return out
