"""Why a slot is broken, and what each cause gets: the one table a repair follows.

A check names the cause of each broken slot (:func:`controller.runtime.core.groups.
broken_slots`) and records it with the degraded reservation; a repair makes each slot
again where its cause's response says (:data:`RESPONSES`); events and the metrics'
``cause`` label carry the string. Pure, no Ray.
"""

from __future__ import annotations

import enum

import msgspec


class Cause(enum.StrEnum):
    """Why a slot is broken. A member is its string (records, events and the metrics'
    label carry the string), so a record read back compares equal to its cause."""

    NODE_LOST = "node-lost"  # the slot's node is dead (Ray's verdict, or placectl's fence)
    NODE_SUSPECTED = "node-suspected"  # its node does not answer, witnesses agree; not dead
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


NODE_LOST, NODE_SUSPECTED, GROUP_REMOVED, GROUP_UNPLACED, DRAIN, OTHER = Cause
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
    # Acting on a suspicion must be undoable: the slot moves (the job goes on at once),
    # the node is kept, and comes back as free capacity if it answers again.
    NODE_SUSPECTED: Response(SPARE, "its node does not answer: the slot moves, the node stays"),
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
    (the wording :func:`~controller.runtime.core.groups.broken_slots` used then)."""
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
    "NODE_SUSPECTED",
    "OTHER",
    "OWN_NODE",
    "RESPONSES",
    "SPARE",
    "Broken",
    "Cause",
    "Response",
    "legacy_cause",
]
