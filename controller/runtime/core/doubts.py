"""What placectl believes of each node: one record per node, a state machine driven by
the facts of the inbox (:mod:`controller.runtime.core.inbox`).

Silence alone never tells a blip from a death; only time or proof can. So a doubt goes
through phases that keep the two things placectl does with it apart: **acting fast and
reversibly** (a suspect's slots move to other nodes, the node itself is kept), and
**fencing** (telling Ray the node is dead, which it never comes back from), which needs
proof or the passing of a grace (:mod:`controller.runtime.steps.liveness`)::

    healthy ──silent──▶ silent ──suspected──▶ suspected ──moved──▶ moved
       ▲                  │  ▲                    │                  │
       │               answered                answered           answered
       │                  ▼  │silent                ▼                  ▼
       └──────swept─────── back ◀─────────────────┴──────────────────┘
    (answered with nothing moved off it: straight back to healthy)
    any phase ──fenced──▶ fenced ──died──▶ dead        any phase ──died──▶ dead

* **healthy**: its raylet answers (or nobody asked: a node without slots).
* **silent**: its raylet has not answered the controller since ``since``; no verdict.
* **suspected**: silent for ``suspect_after`` and witnesses cannot reach it either: every
  slot on it is broken (cause ``node-suspected``) and moves to another node. Nothing
  destructive happens to the node.
* **moved**: suspected, and a reservation's slot has left it (its group removed); the
  node is kept, out of placement, until it answers or its grace ends.
* **back**: it answered again after ranks were moved off it (``owed``): what those ranks
  left there is being ended, then it is healthy, free capacity again, with the same raylet.
* **fenced**: placectl told Ray it is dead, on proof or after the grace; for good.
* **dead**: Ray reports it dead; for good. A dead node id never comes back.

The raylet watch's observations (``silent``, ``answered``, ``suspected``) older than the
newest one applied are dropped: an answer that left before a silence was seen does not
end that silence. ``died`` and ``fenced`` are never dropped, nothing leaves ``fenced`` but
``died``, and nothing leaves ``dead``: a node id Ray declared dead never comes back, so an
answer of Ray's read before a fence (``joined``) cannot make a fenced node alive again.
Pure: imports no Ray, reads no clock.
"""

from __future__ import annotations

import enum

import msgspec

from controller.runtime.core.inbox import OBSERVED, Fact, Kind


class Phase(enum.StrEnum):
    HEALTHY = "healthy"
    SILENT = "silent"
    SUSPECTED = "suspected"
    MOVED = "moved"
    BACK = "back"
    FENCED = "fenced"
    DEAD = "dead"


HEALTHY, SILENT, SUSPECTED, MOVED, BACK, FENCED, DEAD = Phase
FINAL = frozenset({FENCED, DEAD})  # nothing leaves these but fenced -> dead
# A node in these phases is out of placement (no plan, spare or new slot goes there): it
# is suspected, or ranks were moved off it and what they left is not ended yet.
OUT = frozenset({SUSPECTED, MOVED, BACK})
# Watched although no slot is left on it: it must be seen answering (then swept) or
# staying silent (then fenced after the grace).
OPEN = frozenset({SILENT, SUSPECTED, MOVED, BACK})

# Every edge of the machine: (from, fact, to). `step` follows these and no others; the
# failures page draws them (tests/unit/test_doubts.py checks the two agree).
EDGES: tuple[tuple[Phase, Kind, Phase], ...] = (
    (HEALTHY, Kind.SILENT, SILENT),
    (SILENT, Kind.ANSWERED, HEALTHY),  # nothing was moved off it meanwhile
    (SILENT, Kind.ANSWERED, BACK),  # ranks were moved off it: their leftovers go first
    (SILENT, Kind.SUSPECTED, SUSPECTED),
    (HEALTHY, Kind.SUSPECTED, SUSPECTED),  # its silence was seen by a sweep not yet posted
    (BACK, Kind.SUSPECTED, SUSPECTED),
    (SUSPECTED, Kind.MOVED, MOVED),
    (MOVED, Kind.MOVED, MOVED),
    (HEALTHY, Kind.MOVED, BACK),  # it answered before the repair that moved it committed
    (SILENT, Kind.MOVED, SILENT),
    (BACK, Kind.MOVED, BACK),
    (SUSPECTED, Kind.ANSWERED, HEALTHY),  # nothing moved off it (no spare had room)
    (SUSPECTED, Kind.ANSWERED, BACK),
    (MOVED, Kind.ANSWERED, BACK),
    (BACK, Kind.SILENT, SILENT),  # what it owes is kept until it answers again
    (BACK, Kind.SWEPT, HEALTHY),  # once nothing is owed
    (BACK, Kind.SWEPT, BACK),  # something is still owed
    *((p, Kind.FENCED, FENCED) for p in (HEALTHY, SILENT, SUSPECTED, MOVED, BACK)),
    *((p, Kind.DIED, DEAD) for p in (HEALTHY, SILENT, SUSPECTED, MOVED, BACK, FENCED)),
)


class NodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One node as placectl believes it is.

    Attributes:
        node: its id.
        phase: see the module docstring.
        since: when its current doubt began (its first unanswered check), or when it
            last became healthy.
        changed: when it entered ``phase``.
        as_of: the newest observation of the raylet watch applied (its ``when``).
        why: the evidence for its phase, for people (status, events).
        source: who posted the fact that put it in ``phase``.
        owed: reservation uids whose slots moved off it while in doubt: what their
            ranks left there is ended when it answers again, before it is healthy.
        fenced: why placectl fenced it ("" if it did not), kept once Ray reports it dead.
    """

    node: str
    phase: Phase = HEALTHY
    since: float = 0.0
    changed: float = 0.0
    as_of: float = float("-inf")
    why: str = ""
    source: str = ""
    owed: frozenset[str] = frozenset()
    fenced: str = ""


def step(record: NodeRecord, fact: Fact) -> NodeRecord | None:
    """The record after ``fact``, or None when the fact changes nothing or is dropped
    (stale, or no edge of :data:`EDGES` takes it from the record's phase)."""
    if record.phase == DEAD or (record.phase == FENCED and fact.kind != Kind.DIED):
        return None  # final: a dead node id never comes back
    observed = fact.kind in OBSERVED
    if observed and fact.when < record.as_of:
        return None  # taken before a newer observation of the watch already applied
    as_of = max(record.as_of, fact.when) if observed else record.as_of
    owed = record.owed
    if fact.kind == Kind.MOVED:
        owed = owed | {fact.detail}
    elif fact.kind == Kind.SWEPT:
        owed = owed - set(fact.detail.split(","))
    to = _target(record.phase, fact.kind, owed)
    if to is None:
        if as_of == record.as_of and owed == record.owed:
            return None
        return msgspec.structs.replace(record, as_of=as_of, owed=owed)
    since = record.since
    if to == SILENT and record.phase in (HEALTHY, BACK):
        since = fact.when  # a new doubt begins
    elif to == HEALTHY:
        since = fact.when
    changed = fact.when if to != record.phase else record.changed
    return msgspec.structs.replace(
        record,
        phase=to,
        since=since,
        changed=changed,
        as_of=as_of,
        why=fact.detail if fact.kind not in (Kind.MOVED, Kind.SWEPT) else record.why,
        source=fact.source if to != record.phase else record.source,
        owed=owed,
        fenced=fact.detail or "fenced" if fact.kind == Kind.FENCED else record.fenced,
    )


def _target(phase: Phase, kind: Kind, owed: frozenset[str]) -> Phase | None:
    """Where ``kind`` takes a node in ``phase`` (None: it stays), by :data:`EDGES`."""
    targets = [to for frm, k, to in EDGES if frm == phase and k == kind]
    if not targets:
        return None
    # Two edges of one fact are the conditional ones: whether the node still owes a sweep.
    to = (BACK if owed else HEALTHY) if len(targets) > 1 else targets[0]
    return to if to != phase else None


__all__ = [
    "BACK",
    "DEAD",
    "EDGES",
    "FENCED",
    "FINAL",
    "HEALTHY",
    "MOVED",
    "OPEN",
    "OUT",
    "SILENT",
    "SUSPECTED",
    "NodeRecord",
    "Phase",
    "step",
]
