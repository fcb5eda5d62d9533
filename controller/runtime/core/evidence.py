"""Whether a raylet's silence is evidence that its node, not the controller, is gone.

The controller runs on the head. When the head's own link drops, every raylet falls
silent at once, and a controller that fenced on silence alone would fence every node
of every job over a blip that Ray itself survives (measured on hosts in network
namespaces: an 8 s cut of the head's link, Ray alone lost nothing). So a silence
becomes a fence only with evidence from elsewhere, the rule SWIM uses:

1. **Quorum.** Each sweep asks the raylets of the watched nodes and of up to
   ``settings.quorum_sample`` other nodes. The controller counts itself as one node
   that reached itself; a node reached is one that gave any answer (``ok``,
   ``denied``, ``refused``: even a refusal comes from that host's kernel). With no
   strict majority reached, the controller **suspects itself**: it fences no silent
   node, says so once (log, event ``cut_off``, ``health()``, ``placectl status``),
   forgets the silences it saw (they prove nothing), and Ray's own health checks
   decide. Two nodes (head and one) can never outvote each other: a silent node there
   is Ray's to judge.
2. **Witnesses.** From its first silent sweep on, a node's raylet is asked by up to
   ``settings.witnesses`` other nodes that answered the controller (a task on each,
   :func:`controller.runtime.edge.node_tasks.witness`), again and again in the background while
   the silence lasts (:class:`Witnessing`). Silent for ``settings.fence_after``, it is
   fenced only if the latest of those opinions, asked since the silence began, says
   that no witness reached it. A witness that does not reply in time counts for
   nothing; with no reply at all, nothing is fenced. A witness that reaches it ends
   the doubt: the path from the controller is at fault, not the node.
3. **Several connections.** A node in doubt is asked, by the controller and by each
   witness, over ``settings.looks`` connections at once, and answers if any one does
   (:mod:`controller.runtime.edge.answers`): a lossy link stalls one TCP connection for
   seconds behind a lost packet, rarely all of them, where a cut link silences all.

A raylet that *refuses* connections needs none of these: the refusal is its host's own
word that nothing listens there (:mod:`controller.runtime.steps.liveness`).

Pure helpers and one awaited fan-out; imports no Ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from controller.runtime import core
from controller.runtime.core import Tasks
from controller.runtime.edge import ClusterIO
from controller.runtime.edge.answers import DENIED, OK, REFUSED

REACHED = (OK, DENIED, REFUSED)  # any answer proves the path to that host works


def cut_off(reached: int, asked: int) -> bool:
    """Whether a controller that reached ``reached`` of ``asked`` other nodes suspects
    itself: counting itself on both sides, it reached no strict majority."""
    return asked > 0 and 2 * (reached + 1) <= asked + 1


def bystanders(alive: Iterable[str], watched: set[str], own: str, heads: set[str], k: int):
    """Up to ``k`` alive nodes outside ``watched`` (never the controller's own node or
    a head), asked beside the watched ones so that a quorum means something when a job
    holds few nodes; the same ones each sweep (sorted), so their answers compare."""
    others = sorted(n for n in alive if n not in watched and n != own and n not in heads)
    return others[:k]


def witnesses(answered: Mapping[str, str], suspects: set[str], k: int) -> list[str]:
    """Up to ``k`` nodes that answered the controller ``ok`` this sweep, none of them a
    suspect: the ones asked to look at the suspects themselves."""
    return sorted(n for n, a in answered.items() if a == OK and n not in suspects)[:k]


async def confirmed(
    io: ClusterIO, chosen: list[str], addresses: Mapping[str, str], timeout: float, ways: int = 1
) -> tuple[set[str], int]:
    """Which of the suspects (``node -> raylet address``) no witness reached: each
    witness in ``chosen`` asks them all at once. Returns those confirmed silent (some
    witness replied, and none of those that did reached the suspect) and how many
    witnesses replied."""
    if not chosen or not addresses:
        return set(), 0
    replies = await asyncio.gather(
        *(io.witness_answers(w, dict(addresses), timeout, ways) for w in chosen),
        return_exceptions=True,
    )
    heard = [r for r in replies if isinstance(r, dict)]
    if not heard:
        return set(), 0
    reached = {n for r in heard for n, a in r.items() if a in (OK, DENIED)}
    return set(addresses) - reached, len(heard)


class Opinion(NamedTuple):
    """What the witnesses said of one silent node."""

    asked_at: float  # monotonic time the question left
    silent: bool  # some witness replied, and none of those that did reached it
    heard: int  # witnesses that replied
    asked: int  # witnesses asked


class Witnessing:
    """Second opinions on the nodes silent to the controller, asked in the background
    while each silence lasts, one question per node in flight at a time: by the time a
    silence reaches ``fence_after`` an opinion at most a question old is at hand."""

    def __init__(self, io: ClusterIO, tasks: Tasks, timeout: float, ways: int = 1) -> None:
        self._io, self._tasks, self._timeout, self._ways = io, tasks, timeout, ways
        self.latest: dict[str, Opinion] = {}

    def ask(self, node: str, address: str, chosen: list[str]) -> None:
        """Have ``chosen`` ask ``node``'s raylet at ``address``, unless a question about
        it is in flight."""
        if chosen and self._tasks.get("witness", node) is None:
            self._tasks.start("witness", node, self._ask(node, address, chosen))

    async def _ask(self, node: str, address: str, chosen: list[str]) -> None:
        asked_at = core.now()
        silent, heard = await confirmed(
            self._io, chosen, {node: address}, self._timeout, self._ways
        )
        self.latest[node] = Opinion(asked_at, node in silent, heard, len(chosen))

    def since(self, node: str, began: float) -> Opinion | None:
        """The latest opinion on ``node`` asked no earlier than ``began``."""
        got = self.latest.get(node)
        return got if got is not None and got.asked_at >= began else None

    def drop(self, node: str) -> None:
        self.latest.pop(node, None)


__all__ = [
    "REACHED",
    "Opinion",
    "Witnessing",
    "bystanders",
    "confirmed",
    "cut_off",
    "witnesses",
]
