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
2. **Witnesses.** A node silent for ``settings.fence_after`` is fenced only once
   ``settings.witnesses`` other nodes that answered the controller have asked its
   raylet themselves (a task on each, :func:`controller.runtime.probe.witness`) and
   none of them reached it. A witness that does not reply in time counts for nothing;
   with no reply at all, nothing is fenced this sweep.

A raylet that *refuses* connections needs neither: the refusal is its host's own
word that nothing listens there (:mod:`controller.runtime.liveness`).

Pure helpers and one awaited fan-out; imports no Ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from controller.runtime.answers import DENIED, OK, REFUSED
from controller.runtime.io import ClusterIO

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
    io: ClusterIO, chosen: list[str], addresses: Mapping[str, str], timeout: float
) -> tuple[set[str], int]:
    """Which of the suspects (``node -> raylet address``) no witness reached: each
    witness in ``chosen`` asks them all at once. Returns those confirmed silent (some
    witness replied, and none of those that did reached the suspect) and how many
    witnesses replied."""
    if not chosen or not addresses:
        return set(), 0
    replies = await asyncio.gather(
        *(io.witness_answers(w, dict(addresses), timeout) for w in chosen),
        return_exceptions=True,
    )
    heard = [r for r in replies if isinstance(r, dict)]
    if not heard:
        return set(), 0
    reached = {n for r in heard for n, a in r.items() if a in (OK, DENIED)}
    return set(addresses) - reached, len(heard)


__all__ = ["REACHED", "bystanders", "confirmed", "cut_off", "witnesses"]
