"""Whether a raylet's silence is evidence that its node, not the controller, is gone.

The controller runs on the head. When the head's own link drops, every raylet falls
silent at once, and a controller that acted on silence alone would act on every node
of every job over a blip that Ray itself survives (measured on hosts in network
namespaces: an 8 s cut of the head's link, Ray alone lost nothing). So a silence
becomes a suspicion only with evidence from elsewhere, the rule SWIM uses:

1. **Quorum.** Each sweep of the watch asks, beside the watched nodes, a sample of
   ``settings.quorum_sample`` nodes of the whole cluster spread over its racks
   (:func:`sample`: the same nodes while the cluster does not change), and only the
   sample's answers judge the controller itself: a job, or a rack, gone silent together
   is a minority of the sample however many nodes it holds; a caller's sweep (a driver
   asking for verdicts) judges nothing of it. The controller counts itself as one node
   that reached itself; a node reached is one that gave any answer (``ok``,
   ``denied``, ``refused``: even a refusal comes from that host's kernel). With no
   strict majority reached, the controller **suspects itself** (:class:`SelfDoubt`): it
   suspects and fences no silent node, says so once (log, event ``cut_off``,
   ``health()``, ``placectl status``), forgets the silences it saw (they prove nothing),
   and Ray's own health checks decide. It trusts itself again only after
   ``SelfDoubt.clear_after`` sweeps in a row that reach a majority: one lucky sweep in a
   flapping link does not end the doubt. Two nodes (head and one) can never outvote each
   other: a silent node there is Ray's to judge.
2. **Witnesses.** While nodes are silent to the controller, up to ``settings.witnesses``
   other nodes that answered it ask their raylets themselves, all the silent nodes in
   one question (:class:`Witnessing`), again and again while the silence lasts. The
   witnesses are spread over the racks (or NVLink domains) the controller reaches, the
   silent nodes' own first (:func:`witnesses`). A node stays a suspect only while the
   latest of those opinions, asked since its silence began, says that no witness
   reached it. A witness that does not reply in time counts for nothing; with no reply
   at all, nothing is suspected. A witness that reaches it ends the doubt: the path from
   the controller is at fault, not the node.
3. **Several connections.** A node in doubt is asked, by the controller and by each
   witness, over ``settings.looks`` connections at once, and answers if any one does
   (:mod:`controller.runtime.edge.answers`): a lossy link stalls one TCP connection for
   seconds behind a lost packet, rarely all of them, where a cut link silences all.

What the evidence supports is a *suspicion*, acted on reversibly (the suspect's slots
move; the node is kept). In a two-sided split (a rack's uplink down) every witness the
controller can ask stands on its own side, so a cut-off rack and a dead one read the
same: only time (the grace) or proof tells them apart
(:mod:`controller.runtime.steps.liveness`). **Proof** is a refusal: the suspect's own
kernel saying nothing listens on the raylet's port, heard by the controller and by a
second path (a witness, or, where no witness replies, a second port of the raylet's
process), never while the controller suspects itself.

Pure helpers and one awaited fan-out; imports no Ray.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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


class SelfDoubt:
    """Whether the controller suspects itself, from one sample (a sweep's count of the
    nodes it reached) at a time: at once when a sweep reaches no majority, and until
    ``clear_after`` sweeps in a row reach one.

    Attributes:
        since: when (wall clock) the doubt began; None while the controller trusts itself.
        reached, asked: the sample that began it.
    """

    def __init__(self, clear_after: int = 2) -> None:
        self.clear_after = clear_after
        self.since: float | None = None
        self.reached = self.asked = 0
        self._good = 0

    @property
    def doubted(self) -> bool:
        return self.since is not None

    def sample(self, reached: int, asked: int) -> str | None:
        """Take one sweep's count; ``"began"`` or ``"ended"`` when the doubt did so."""
        if cut_off(reached, asked):
            self._good = 0
            if self.since is None:
                self.since, self.reached, self.asked = core.wall(), reached, asked
                return "began"
            return None
        if self.since is None:
            return None
        self._good += 1
        if self._good < self.clear_after:
            return None
        self.since, self._good = None, 0
        return "ended"

    @staticmethod
    def said(change: str, reached: int, asked: int, was: float | None) -> str:
        """What to say of a ``change`` of :meth:`sample` (``was``: when the doubt that
        ended began)."""
        if change == "began":
            return (
                f"the controller reaches {reached} of {asked} node(s) it asked: it "
                "suspects itself and suspects and fences no silent node; Ray's health "
                "checks decide"
            )
        lasted = core.wall() - (was or core.wall())
        return f"the controller reaches {reached} of {asked} node(s) again after {lasted:.1f}s"

    def shown(self) -> dict | None:
        """What ``health()`` shows: since when, and what the first sample reached."""
        if self.since is None:
            return None
        return {"since": self.since, "reached": self.reached, "asked": self.asked}


def sample(nodes: Iterable[str], k: int, side: Callable[[str], str] = lambda n: "") -> list[str]:
    """The quorum's sample of the whole cluster from ``nodes`` (the alive ones, the
    controller's own and the heads left out): all of them in a cluster of at most
    ``2k + 1``, else ``k``, one per side in turn (``side(node)``: its rack or NVLink
    domain), so that a rack or a job gone silent together is a minority of it however
    many of the nodes watched it holds. In an order of their ids' hashes, not of the
    ids, which placement follows; the same nodes each sweep while the cluster does not
    change, so their answers compare."""
    nodes = sorted(nodes)
    if len(nodes) <= 2 * k + 1:
        return nodes
    by_side: dict[str, list[str]] = {}
    for n in sorted(nodes, key=lambda n: hashlib.blake2b(n.encode(), digest_size=8).digest()):
        by_side.setdefault(side(n), []).append(n)
    chosen: list[str] = []
    queues = [by_side[s] for s in sorted(by_side)]
    while len(chosen) < k:
        for q in queues:
            if q and len(chosen) < k:
                chosen.append(q.pop(0))
    return chosen


def homes(
    watched: set[str],
    sampled: Iterable[str],
    away: set[str],
    k: int,
    side: Callable[[str], str] = lambda node: "",
) -> list[str]:
    """Where ``k`` witnesses stand: the same few nodes while the cluster does not change
    (one more than are asked at a time, for when one of them is the suspect), none of
    them in doubt (``away``); none while nothing is ``watched``. Spread over the sides
    (racks, NVLink domains) as :func:`witnesses` asks them, the watched nodes' sides
    first, so that a question about a silent node finds its witnesses already standing;
    in each side a node not watched first, which is never the suspect itself (the
    witness in a suspect's own rack is then one of its rack-mates)."""
    if not watched:
        return []
    by_side: dict[str, list[str]] = {}
    for n in sorted((watched | set(sampled)) - away, key=lambda n: (n in watched, n)):
        by_side.setdefault(side(n), []).append(n)
    theirs = {side(n) for n in watched}
    return _round_robin(by_side, sorted(by_side, key=lambda s: (s not in theirs, s)), k)


def _round_robin(by_side: dict[str, list[str]], order: list[str], k: int) -> list[str]:
    """Up to ``k`` nodes, one from each side of ``order`` in turn (each side's list is
    taken from its front)."""
    queues = [list(by_side[s]) for s in order]
    chosen: list[str] = []
    while len(chosen) < k and any(queues):
        for q in queues:
            if q and len(chosen) < k:
                chosen.append(q.pop(0))
    return chosen


def witnesses(
    answered: Mapping[str, str],
    suspects: set[str],
    k: int,
    side: Callable[[str], str] = lambda node: "",
    standing: Iterable[str] = (),
) -> list[str]:
    """Up to ``k`` nodes that answered the controller ``ok`` this sweep, none of them a
    suspect: the ones asked to look at the suspects themselves. Spread over the sides
    (``side(node)``: its rack or NVLink domain, "" unknown) round robin, the suspects' own
    sides first: a witness in the suspect's rack tells a dead node from a rack cut off
    from the head's side, where that rack can still be reached. Within a side, a node
    where a witness already stands (``standing``) first: one started for the question
    first starts a process."""
    up = set(standing)
    able = sorted(
        (n for n, a in answered.items() if a == OK and n not in suspects),
        key=lambda n: (n not in up, n),
    )
    by_side: dict[str, list[str]] = {}
    for n in able:
        by_side.setdefault(side(n), []).append(n)
    theirs = {side(s) for s in suspects}
    return _round_robin(by_side, sorted(by_side, key=lambda s: (s not in theirs, s)), k)


class Opinion(NamedTuple):
    """What the witnesses said of one silent node."""

    asked_at: float  # monotonic time the question left
    silent: bool  # some witness replied, and none of those that did reached it
    refused: bool  # some witness that replied found its port refused, none reached it
    heard: int  # witnesses that replied
    asked: int  # witnesses asked
    sides: int  # how many sides (racks, domains) the witnesses that replied stand on

    def says(self, silent_for: float) -> str:
        """The evidence, for people, of a node silent to the controller ``silent_for``."""
        seen = f"{self.heard} of {self.asked} other node(s) cannot reach it either"
        if self.sides > 1:
            seen += f", from {self.sides} racks"
        return f"its raylet has not answered for {silent_for:.1f}s; {seen}"


@dataclass
class Evidence:
    """What the watch has seen of one node: one record per node it watches.

    Attributes:
        answer: the raylet's last answer to the controller.
        silent_since: the first unanswered check of the silence in progress, if any.
        refused_at: the first refusal of the refusals in progress, if any.
        second: what the raylet's second port answered the last sweep that asked it.
        proof: why its death is proven (a refusal heard on a second path), once it is.
        withheld: said once that no witness could look at it (until it answers).
        detour: said once that witnesses reach it though the controller does not.
        answered_at: when the question it last answered left (a sweep that left
            before then and found it silent is older news).
    """

    answer: str = ""
    silent_since: float | None = None
    refused_at: float | None = None
    second: str = ""
    proof: str = ""
    withheld: bool = False
    detour: bool = False
    answered_at: float = float("-inf")

    def clear(self) -> None:
        """It answered: every doubt of this silence ends."""
        self.silent_since = self.refused_at = None
        self.second = self.proof = ""
        self.withheld = self.detour = False


async def confirmed(
    io: ClusterIO,
    chosen: list[str],
    addresses: Mapping[str, str],
    timeout: float,
    ways: int = 1,
    side: Callable[[str], str] = lambda node: "",
) -> dict[str, Opinion]:
    """What the witnesses in ``chosen`` say of each suspect (``node -> raylet
    address``): each witness asks them all at once, in one call. A suspect is silent if
    some witness replied and none of those that did reached it."""
    asked_at = core.now()
    if not chosen or not addresses:
        return {}
    replies = await asyncio.gather(
        *(io.witness_answers(w, dict(addresses), timeout, ways) for w in chosen),
        return_exceptions=True,
    )
    heard = {w: r for w, r in zip(chosen, replies, strict=True) if isinstance(r, dict)}
    sides = len({side(w) for w in heard})
    out = {}
    for node in addresses:
        said = [r.get(node) for r in heard.values()]
        reached = any(a in (OK, DENIED) for a in said)
        refused = bool(heard) and not reached and any(a == REFUSED for a in said)
        out[node] = Opinion(asked_at, bool(heard) and not reached, refused, len(heard),
                            len(chosen), sides)  # fmt: skip
    return out


class Witnessing:
    """Second opinions on the nodes silent to the controller, asked in the background
    while each silence lasts: one question in flight at a time, about every silent node
    at once (a witness asked about each node in turn would miss the window for the
    third), so by the time a silence reaches ``suspect_after`` an opinion at most a
    question old is at hand."""

    def __init__(
        self,
        io: ClusterIO,
        tasks: Tasks,
        timeout: float,
        ways: int = 1,
        side: Callable[[str], str] = lambda node: "",
    ) -> None:
        self._io, self._tasks, self._timeout, self._ways = io, tasks, timeout, ways
        self._side = side
        self.latest: dict[str, Opinion] = {}
        self._asked: list[str] = []  # the witnesses of the latest question

    def ask(self, suspects: Mapping[str, str], chosen: list[str]) -> asyncio.Task | None:
        """Have ``chosen`` ask the raylets of ``suspects`` (node -> address), unless a
        question is in flight (the suspects it leaves out are asked by the next); the
        question's task."""
        if not chosen or not suspects or self.asking() is not None:
            return self.asking()
        self._asked = list(chosen)
        return self._tasks.start("witness", "round", self._ask(dict(suspects), chosen))

    def asking(self) -> asyncio.Task | None:
        """The question in flight, if one is."""
        return self._tasks.get("witness", "round")

    def asked(self) -> list[str]:
        """The witnesses of the question in flight: ending one would lose its reply."""
        return list(self._asked) if self.asking() is not None else []

    async def _ask(self, suspects: dict[str, str], chosen: list[str]) -> None:
        got = await confirmed(self._io, chosen, suspects, self._timeout, self._ways, self._side)
        self.latest.update(got)

    def since(self, node: str, began: float) -> Opinion | None:
        """The latest opinion on ``node`` asked no earlier than ``began``."""
        got = self.latest.get(node)
        return got if got is not None and got.asked_at >= began else None

    def drop(self, node: str) -> None:
        self.latest.pop(node, None)


__all__ = [
    "REACHED",
    "Evidence",
    "Opinion",
    "SelfDoubt",
    "Witnessing",
    "confirmed",
    "cut_off",
    "sample",
    "witnesses",
]
