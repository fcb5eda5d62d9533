"""The controller's verdict on a node, as a driver's ``repair()`` reads it
(``PlacementController.verdicts``): strings that cross from the controller to clients.

* ``alive``: it answers (or nobody watches it: the head, a node without slots).
* ``silent``: its raylet does not answer the controller; no verdict yet.
* ``suspected``: silent long enough, and witnesses cannot reach it either: the job's
  slot there is about to move to another node. No verdict yet for its ranks.
* ``moved``: the node is in doubt and the job's slots have left it: the job's ranks
  there are lost (their group is removed), though the node itself is kept.
* ``dead``: Ray reports it dead, placectl fenced it, or its death is proven (its raylet
  refused on two paths).
* ``unknown``: placectl's calls are refused there, or the controller suspects itself
  (it reaches no majority of the nodes): Ray's verdict decides.

A rank's verdict is final on ``alive`` (with its own answer), ``moved`` and ``dead``;
on the others a driver waits (:mod:`clients.verdict`).
"""

from __future__ import annotations

ALIVE, SILENT, SUSPECTED, MOVED, DEAD, UNKNOWN = (
    "alive",
    "silent",
    "suspected",
    "moved",
    "dead",
    "unknown",
)
VERDICTS = (ALIVE, SILENT, SUSPECTED, MOVED, DEAD, UNKNOWN)
GONE = frozenset({MOVED, DEAD})  # the job's ranks on such a node are lost

__all__ = ["ALIVE", "DEAD", "GONE", "MOVED", "SILENT", "SUSPECTED", "UNKNOWN", "VERDICTS"]
