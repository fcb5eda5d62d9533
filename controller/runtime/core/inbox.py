"""Node facts, and the one inbox every one of them arrives in.

Whatever the controller learns about a node (Ray's node events, a read of Ray's node
table or of its dead nodes, a drain Ray announces, the raylet watch's answers and
verdicts, a repair that moved slots off a node in doubt, the operator's cordon and fence)
is posted here as one typed :class:`Fact`: which node, what kind, who saw it, and when
the evidence was taken. Nobody else carries node news: no callback, no shared set, no
event of its own. The node view (:class:`controller.runtime.core.nodes.ClusterNodes`)
owns the inbox and is the only one to apply what it holds (:meth:`ClusterNodes.settle`);
a non-empty inbox wakes the loop, whose first step settles it and checks the jobs on
every node a fact changed.

``when`` is the controller's clock (:func:`controller.runtime.core.now`) at the moment
the evidence was *taken* (a read sent, a health check started), not when it was posted:
an answer that left before a newer verdict arrived is older than that verdict, and the
node view drops it instead of undoing the verdict with it.
"""

from __future__ import annotations

import asyncio
import collections
import enum

import msgspec


class Kind(enum.StrEnum):
    """What a fact says of its node."""

    JOINED = "joined"  # Ray lists it alive (its event, or a read of Ray's tables)
    DIED = "died"  # Ray reports it dead (its event, or a read): for good
    SILENT = "silent"  # its raylet stopped answering the controller (evidence: when)
    ANSWERED = "answered"  # its raylet answers the controller (again)
    SUSPECTED = "suspected"  # silent long enough, witnesses agree: its slots move now
    MOVED = "moved"  # a reservation's slot left it while in doubt (detail: the uid)
    SWEPT = "swept"  # back, what moved ranks left there is ended (detail: the uids)
    FENCED = "fenced"  # placectl told Ray it is dead (proof, grace, or the operator)
    DRAINING = "draining"  # Ray drains it (deadline: wall clock, 0 for none)
    UNDRAINED = "undrained"  # Ray no longer drains it
    CORDONED = "cordoned"  # an operator took it out of placement (drain: move its slots)
    UNCORDONED = "uncordoned"  # given back to placement


class Source(enum.StrEnum):
    """Who posted a fact."""

    RAY_EVENT = "ray event"  # Ray's node-info subscription
    RAY_READ = "ray read"  # a read of Ray's node table, dead nodes or draining nodes
    WATCH = "watch"  # the raylet watch (controller.runtime.steps.liveness)
    REPAIR = "repair"  # a repair or move that took slots off a node in doubt
    OPERATOR = "operator"  # placectl cordon, drain, fence, uncordon
    TABLE = "table"  # the cordons kept in the table, at recovery


# The raylet watch's observations: each is judged against the newest of them applied to
# its node, and dropped if older. Ray's own (joined, died) need no clock: a node id Ray
# declared dead never comes back, so nothing applies to it after `died` or `fenced`.
OBSERVED = frozenset({Kind.SILENT, Kind.ANSWERED, Kind.SUSPECTED})


class Fact(msgspec.Struct, frozen=True, kw_only=True):
    """One thing learned about one node."""

    node: str
    kind: Kind
    source: Source
    when: float  # the controller's clock when the evidence was taken
    detail: str = ""  # why, for people; the reservation uid(s) for MOVED and SWEPT
    deadline: float = 0.0  # DRAINING: the drain's deadline, wall clock (0: none)
    drain: bool = False  # CORDONED: the operator drained it too


class Inbox:
    """The queue of facts not yet applied, and the loop's wake-up: it is set by every
    post and cleared only by the loop, once it has followed up on what was applied
    (a call may settle the inbox before the loop wakes; the loop still follows up)."""

    def __init__(self) -> None:
        self._facts: collections.deque[Fact] = collections.deque()
        self.wakeup = asyncio.Event()
        self.posted = 0  # facts ever posted (health, tests)

    def post(self, fact: Fact) -> None:
        self._facts.append(fact)
        self.posted += 1
        self.wakeup.set()

    def waiting(self, node: str) -> list[Fact]:
        """The facts about ``node`` posted and not applied yet, in the order posted."""
        return [f for f in self._facts if f.node == node]

    def take(self) -> list[Fact]:
        """Every fact waiting, in the order posted; the inbox is empty after."""
        facts = list(self._facts)
        self._facts.clear()
        return facts

    def __len__(self) -> int:
        return len(self._facts)


__all__ = ["OBSERVED", "Fact", "Inbox", "Kind", "Source"]
