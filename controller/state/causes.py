"""Why a reservation is degraded, as data.

A cause is named once, where the break is found (:func:`controller.runtime.groups.broken_slots`
for each slot, the drain watch for a move), and carried from there: by the record while it
is degraded (``ReservationRecord.cause``; its human reason may change as a repair goes on,
the cause does not), by the ``degraded`` and ``repaired`` events, and by the metrics'
``cause`` label. Nothing reads a cause back out of a message, but for records written
before the cause was kept (:func:`legacy_cause`).
"""

from __future__ import annotations

import msgspec

NODE_LOST = "node-lost"  # the slot's node is dead (Ray's verdict, or placectl's fence)
GROUP_REMOVED = "group-removed"  # its placement group was removed behind placectl's back
GROUP_UNPLACED = "group-unplaced"  # Ray reports its group neither CREATED nor REMOVED
DRAIN = "drain"  # its node is being drained: moved make before break
OTHER = "other"  # anything else (records from before causes were kept included)
CAUSES = (NODE_LOST, GROUP_REMOVED, GROUP_UNPLACED, DRAIN, OTHER)


class Broken(msgspec.Struct, frozen=True):
    """One broken slot: its cause (one of :data:`CAUSES`) and a line for people."""

    cause: str
    why: str


def legacy_cause(reason: str) -> str:
    """The cause of a degraded record written before causes were kept, from its reason
    (the wording :func:`~controller.runtime.groups.broken_slots` used then)."""
    if " is dead" in reason or " dead;" in reason:
        return NODE_LOST
    if " was removed" in reason:
        return GROUP_REMOVED
    if "placement group is " in reason:
        return GROUP_UNPLACED
    return OTHER


__all__ = ["CAUSES", "DRAIN", "GROUP_REMOVED", "GROUP_UNPLACED", "NODE_LOST", "OTHER", "Broken"]
