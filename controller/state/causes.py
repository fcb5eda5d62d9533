"""Why a reservation is degraded, as data.

A cause is named once, where the break is found (:func:`controller.runtime.groups.broken_slots`
for each slot, the drain watch for a move), and carried from there: by the record while it
is degraded (``ReservationRecord.cause``; its human reason may change as a repair goes on,
the cause does not), by the ``degraded`` and ``repaired`` events, and by the metrics'
``cause`` label. Nothing reads a cause back out of a message, but for records written
before the cause was kept (:func:`legacy_cause`).
"""

from __future__ import annotations

import enum

import msgspec


class Cause(enum.StrEnum):
    """Why a slot is broken. A member is its string (records, events and the metrics'
    label carry the string), so a record read back compares equal to its cause."""

    NODE_LOST = "node-lost"  # the slot's node is dead (Ray's verdict, or placectl's fence)
    GROUP_REMOVED = "group-removed"  # its placement group was removed behind placectl's back
    GROUP_UNPLACED = "group-unplaced"  # Ray reports its group neither CREATED nor REMOVED
    DRAIN = "drain"  # its node is being drained: moved make before break
    OTHER = "other"  # anything else (records from before causes were kept included)

    @classmethod
    def of(cls, value: str) -> Cause:
        """The cause a record carries; one this version does not know is ``OTHER``."""
        try:
            return cls(value)
        except ValueError:
            return cls.OTHER


NODE_LOST, GROUP_REMOVED, GROUP_UNPLACED, DRAIN, OTHER = Cause
CAUSES = tuple(Cause)

OWN_NODE = "own node"  # the slot is made again where it was
SPARE = "spare"  # on a spare node of the same kind; without one, the autoscaler is asked


class Response(msgspec.Struct, frozen=True):
    """What a repair does about a broken slot of one cause."""

    replace_on: str  # OWN_NODE or SPARE: where the slot is made again
    why: str  # for people: why that is the answer


# The one table of what each cause gets. A slot whose cause says OWN_NODE goes to a spare
# anyway when its node no longer takes slots (it died or started draining meanwhile).
RESPONSES: dict[Cause, Response] = {
    NODE_LOST: Response(SPARE, "its node is gone"),
    GROUP_REMOVED: Response(OWN_NODE, "its node still holds the room the group had"),
    GROUP_UNPLACED: Response(OWN_NODE, "its node is alive; the group is made again there"),
    DRAIN: Response(SPARE, "its node is going: the slot moves before the deadline"),
    OTHER: Response(SPARE, "nothing says its node is sound"),
}


class Broken(msgspec.Struct, frozen=True):
    """One broken slot: its cause and a line for people."""

    cause: Cause
    why: str


def legacy_cause(reason: str) -> Cause:
    """The cause of a degraded record written before causes were kept, from its reason
    (the wording :func:`~controller.runtime.groups.broken_slots` used then)."""
    if " is dead" in reason or " dead;" in reason:
        return NODE_LOST
    if " was removed" in reason:
        return GROUP_REMOVED
    if "placement group is " in reason:
        return GROUP_UNPLACED
    return OTHER


__all__ = [
    "CAUSES",
    "DRAIN",
    "GROUP_REMOVED",
    "GROUP_UNPLACED",
    "NODE_LOST",
    "OTHER",
    "OWN_NODE",
    "RESPONSES",
    "SPARE",
    "Broken",
    "Cause",
    "Response",
]
