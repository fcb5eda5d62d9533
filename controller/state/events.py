"""What happened to reservations, as ``placectl events`` shows it: pure, no Ray.

Every change of a reservation goes through one commit (:mod:`controller.runtime.core.state`),
so what happened is read off the record before and after it: :func:`happened` compares
the two and names the transition (reserved, degraded, repaired with its cause, moved off
a draining node, admitted, preempted, applied, released). Nothing at a call site says
"log an event", so no change can happen without its event, and none is told twice.
"""

from __future__ import annotations

import time

import msgspec

from controller.state.causes import (  # noqa: F401  (re-exported: the events' causes)
    CAUSES,
    DRAIN,
    GROUP_REMOVED,
    GROUP_UNPLACED,
    NODE_LOST,
    NODE_SUSPECTED,
    OTHER,
    Cause,
    legacy_cause,
)
from controller.state.records import DEGRADED, PENDING, QUEUED, READY, RELEASING, ReservationRecord

# Kinds, in the order a reservation meets them.
QUEUED_EV = "queued"
ADMITTED = "admitted"
RESERVED = "reserved"
DEGRADED_EV = "degraded"
REPAIRED = "repaired"
MOVED = "moved"
APPLIED = "applied"
PREEMPTED = "preempted"
RELEASING_EV = "releasing"
RELEASED = "released"
QUOTA = "quota"
OPERATOR = "operator"
FENCED = "fenced"  # a node placectl told Ray is dead
SUSPECTED = "suspected"  # a node silent to the controller and its witnesses: its slots move
BACK = "back"  # a suspected node answers again: what moved off it was ended, it is free
HELD_DOWN = "held_down"  # a node suspected again and again: out of placement for a while
DENIED = "denied"  # a node's raylet or the GCS refused placectl's own calls
CUT_OFF = "cut_off"  # the controller reaches no majority of nodes (or again does)
CORDON = "cordon"  # an operator cordoned, drained or uncordoned a node
SPARES = "spares"  # the held spares changed: taken, dropped, or made a lost node's slot
KINDS = (
    QUEUED_EV,
    ADMITTED,
    RESERVED,
    DEGRADED_EV,
    REPAIRED,
    MOVED,
    APPLIED,
    PREEMPTED,
    RELEASING_EV,
    RELEASED,
    QUOTA,
    OPERATOR,
    FENCED,
    SUSPECTED,
    BACK,
    HELD_DOWN,
    DENIED,
    CUT_OFF,
    CORDON,
    SPARES,
)

# Causes of a degradation (and of the repair that ends it): data, named where the break
# is found (controller.state.records).

CONTROLLER = "controller"  # who acted when no client did (the control loop)


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One thing that happened, kept in the bounded history beside the table.

    Attributes:
        seq: its number, growing across controller restarts.
        at: when (wall-clock seconds).
        job: the reservation ("" for a queue's quota).
        kind: one of :data:`KINDS`.
        message: what happened, in one line.
        by: who: ``controller``, or ``client <owner hash>`` (``(forced)`` when the client
            acted on a reservation it does not own).
        epoch: the reservation's epoch after it.
        queue: the reservation's queue ("" for none).
        cause: why, for ``degraded`` and ``repaired`` (one of :data:`CAUSES`).
        seconds: how long it took: the wait for ``admitted``, the time degraded for
            ``repaired`` (0 when not known).
    """

    seq: int = 0
    at: float = 0.0
    job: str
    kind: str
    message: str
    by: str = CONTROLLER
    epoch: int = 0
    queue: str = ""
    cause: str = ""
    seconds: float = 0.0


def cause_of(record: ReservationRecord) -> Cause:
    """Why ``record`` is degraded: the cause it carries, or, for a record written before
    causes were kept, the one its reason names."""
    return Cause.of(record.cause) if record.cause else legacy_cause(record.reason)


def _where(record: ReservationRecord) -> str:
    nodes = len(record.node_ids())
    return f"{nodes} node(s), {record.accelerators()} {record.spec.accelerator}"


def happened(
    old: ReservationRecord | None,
    new: ReservationRecord | None,
    degraded_since: float = 0.0,
    now: float | None = None,
) -> list[Event]:
    """The events of one change of a job's record, ``old`` to ``new`` (None: none).

    Args:
        old: the record before (None: the job had none).
        new: the record after (None: the record was deleted, the job released).
        degraded_since: when the job became degraded (0: not known), for ``repaired``.
        now: the time of the change (default: now).

    Returns:
        The events, without ``seq`` and ``by`` (the history numbers and signs them);
        empty for a change users do not follow (a port lease, a reason reworded).
    """
    now = time.time() if now is None else now
    rec = new if new is not None else old
    if rec is None:
        return []
    base = {"job": rec.job, "at": now, "epoch": rec.epoch, "queue": rec.queue}
    if new is None:
        return [Event(kind=RELEASED, message="released: every group removed", **base)]
    if old is not None and old.uid != new.uid and old.state != QUEUED:
        old = None  # a new reservation of the job's name (replace): told as new
    # (an admitted reservation gets its uid when it is placed: still the queued one)
    out: list[Event] = []
    was = old.state if old is not None else None
    if new.state == QUEUED and was != QUEUED:
        what = f"queued in {new.queue!r} at priority {new.priority}"
        out.append(Event(kind=QUEUED_EV, message=what, **base))
    if was == QUEUED and new.state != QUEUED and new.state != RELEASING:
        waited = max(0.0, now - new.queued_at) if new.queued_at else 0.0
        what = f"admitted from {new.queue!r} after {waited:.1f}s"
        out.append(Event(kind=ADMITTED, message=what, seconds=waited, **base))
    if new.state == READY and was in (None, QUEUED, PENDING):
        out.append(Event(kind=RESERVED, message=f"reserved: {_where(new)}", **base))
    if new.state == DEGRADED and was != DEGRADED:
        cause = cause_of(new)
        what = f"degraded: {new.reason}" if new.reason else "degraded"
        out.append(Event(kind=DEGRADED_EV, message=what, cause=cause, **base))
    if old is not None and was == DEGRADED and new.state == READY:
        took = max(0.0, now - degraded_since) if degraded_since else 0.0
        moved = new.epoch > old.epoch
        what = (
            f"repaired: lost slots replaced, epoch {old.epoch} -> {new.epoch}"
            if moved
            else "ready again: Ray reports every group placed"
        )
        cause = cause_of(old)
        out.append(Event(kind=REPAIRED, message=what, cause=cause, seconds=took, **base))
    if old is not None and was == READY == new.state and len(new.leaving) > len(old.leaving):
        gone = {x.node_id[:12] for x in old.leaving}
        nodes = sorted({x.node_id[:12] for x in new.leaving} - gone)
        what = f"moved off draining node(s) {', '.join(nodes)}, epoch {old.epoch} -> {new.epoch}"
        out.append(Event(kind=MOVED, message=what, cause=DRAIN, **base))
    if old is not None and old.settled and new.settled and _applied(old, new):
        sizes = ", ".join(f"{n} x{w}" for n, w in new.world_sizes.items())
        what = f"applied: {sizes}, epoch {old.epoch} -> {new.epoch}"
        out.append(Event(kind=APPLIED, message=what, **base))
    if new.preempt_at and not (old is not None and old.preempt_at):
        out.append(Event(kind=PREEMPTED, message=new.reason or "preempted", **base))
    held = {s.group_id for s in new.spares}
    changed = old is not None and {s.group_id for s in old.spares} != held
    short = old is not None and new.spares_short and new.spares_short != old.spares_short
    if new.settled and (changed or short):
        took = {s.group_id for s in old.spares} & {s.group_id for s in new.slots}
        where = ", ".join(s.node_ip for s in new.spares) or "none"
        what = f"spares: {len(new.spares)} of {new.spec.spares} held ({where})"
        if took:
            what += f"; {len(took)} made a lost node's slot"
        if new.spares_short:
            what += f"; fewer: {new.spares_short}"
        out.append(Event(kind=SPARES, message=what, **base))
    if new.state == RELEASING and was != RELEASING:
        out.append(Event(kind=RELEASING_EV, message="releasing: removing its groups", **base))
    return out


def _applied(old: ReservationRecord, new: ReservationRecord) -> bool:
    """An apply or resize landed: a new configuration and a new epoch."""
    return (
        new.epoch > old.epoch
        and new.applying is None
        and (new.spec != old.spec or new.world_sizes != old.world_sizes)
    )


def quota_set(queue: str, limits: dict[str, float], now: float | None = None) -> Event:
    """The event of a queue's quota set (``{}``: removed)."""
    shown = ", ".join(f"{k}={v:g}" for k, v in sorted(limits.items()))
    what = f"quota of {queue!r} set: {shown}" if limits else f"quota of {queue!r} removed"
    return Event(
        job="", kind=QUOTA, message=what, queue=queue, at=time.time() if now is None else now
    )


def cordon_set(what: str, now: float | None = None) -> Event:
    """The event of a node cordoned, drained or uncordoned (``what``: the line)."""
    return Event(job="", kind=CORDON, message=what, at=time.time() if now is None else now)


def operator_set(hashed: str, now: float | None = None) -> Event:
    """The event of the operator's token set (or replaced)."""
    return Event(
        job="",
        kind=OPERATOR,
        message=f"operator token set (hash {hashed[:8]}): quota changes now need it",
        at=time.time() if now is None else now,
    )


def _of_node(kind: str, node_id: str, ip: str, what: str, now: float | None) -> Event:
    """An event about one node, named by its address and id: "node <where> <what>"."""
    where = f"{ip} ({node_id[:12]})" if ip else node_id[:12]
    return Event(
        job="", kind=kind, message=f"node {where} {what}", at=time.time() if now is None else now
    )


def fenced(node_id: str, ip: str, why: str, now: float | None = None) -> Event:
    """The event of a node fenced: placectl told Ray it is dead, and why."""
    return _of_node(FENCED, node_id, ip, f"fenced: {why}", now)


def suspected(node_id: str, ip: str, why: str, now: float | None = None) -> Event:
    """The event of a node suspected: silent to the controller and to the witnesses it
    asked; its slots move to other nodes, the node is kept (not fenced)."""
    return _of_node(SUSPECTED, node_id, ip, f"suspected: {why}", now)


def back(node_id: str, ip: str, why: str, now: float | None = None) -> Event:
    """The event of a suspected node answering again: kept, not lost."""
    return _of_node(BACK, node_id, ip, f"is back: {why}", now)


def held_down(node_id: str, ip: str, why: str, now: float | None = None) -> Event:
    """The event of a flapping node held down: no slot or spare lands on it for a while."""
    return _of_node(HELD_DOWN, node_id, ip, f"held down: {why}", now)


def denied(key: str, why: str, now: float | None = None) -> Event:
    """The event of placectl's own calls refused by a node's raylet or by the GCS
    (``key``: a node id or ``gcs``): its fault detection is off there."""
    who = (
        "the GCS refuses placectl's fence"
        if key == "gcs"
        else (f"node {key[:12]}'s raylet refuses placectl's health checks")
    )
    return Event(
        job="",
        kind=DENIED,
        message=f"{who} ({why}); Ray's own health checks decide there",
        at=time.time() if now is None else now,
    )


def cut_off(what: str, now: float | None = None) -> Event:
    """The event of the controller suspecting itself (it reaches no majority of the
    nodes it asks, so it fences nothing), or of its trusting itself again."""
    return Event(job="", kind=CUT_OFF, message=what, at=time.time() if now is None else now)


__all__ = [
    "CAUSES",
    "KINDS",
    "Cause",
    "Event",
    "back",
    "cause_of",
    "cut_off",
    "denied",
    "fenced",
    "happened",
    "operator_set",
    "quota_set",
    "suspected",
]
