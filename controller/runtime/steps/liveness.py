"""Nodes that fall silent: suspected fast and acted on reversibly, fenced only on proof
or after a grace.

Ray learns that a node died abruptly (its machine lost power, its raylet was killed)
only when the GCS's health checks give up: with Ray's defaults
(``health_check_period_ms=3000``, ``health_check_timeout_ms=10000``,
``health_check_failure_threshold=5``) about 15 s for a node whose processes are gone and
about a minute for one that is silent, during which Ray calls the node alive and every
call to its workers fails. The controller does not wait for that to let a job go on, but
silence alone can never tell a blip from a death: only time, or proof, can. So it keeps
two things apart (:mod:`controller.runtime.core.doubts`):

* **Suspect fast, act reversibly.** Every ``settings.liveness_period`` it asks the raylet
  of each node holding a slot whether it answers (:mod:`controller.runtime.edge.answers`).
  A raylet silent for ``settings.suspect_after``, that the witnesses do not reach either
  (:mod:`controller.runtime.core.evidence`), makes its node a **suspect**: its slots move
  to other nodes (cause ``node-suspected``), so the job goes on at once. Nothing
  destructive happens to the node: it is kept, out of placement, watched.
* **A suspect that answers again is not lost** (:mod:`controller.runtime.steps.returning`).
* **Fence on proof or after the grace** (:mod:`controller.runtime.steps.fencing`): a
  node never comes back from a fence. placectl fences only:

  - on **proof**: the raylet's port refused (the host's own kernel saying nothing listens
    there), by the controller and by a second path: a witness that finds it refused too,
    or, where no witness replies, a second port of the raylet's process; confirmed
    ``settings.refused_confirm`` apart, never while the controller suspects itself;
  - after the **grace** (``settings.fence_grace``; by default Ray's own detection of a
    silent node, from the cluster's health-check settings): a suspect still silent, to
    the controller and to the witnesses, that long after its silence began;
  - when an **operator** says so (``placectl fence NODE``).

A node that is only slow is never suspected: a raylet answers health checks from its
gRPC threads, whatever its tasks do, and one answer clears every doubt. The head node
(this controller's own) is never watched. An answer of a raylet that refuses placectl is
no evidence of death: the node is not suspected, that is said once (log, event history,
``health()``), and Ray's own health checks decide. Everything the watch learns goes to
the node view as a fact (:mod:`...core.inbox`); what it has seen of each node it watches
is one record (:class:`controller.runtime.core.evidence.Evidence`).
"""

from __future__ import annotations

import asyncio
import logging

from controller.planning.topology import topology_of
from controller.runtime import core
from controller.runtime.core import doubts, evidence
from controller.runtime.core.context import Context
from controller.runtime.core.inbox import Fact, Kind, Source
from controller.runtime.edge.answers import DENIED, OK, REFUSED
from controller.runtime.steps.fencing import Fencer
from controller.runtime.steps.returning import Returning, where
from controller.state import events as ev
from controller.state import verdicts as vd

log = logging.getLogger("placectl.controller")

_SECOND = "#second"  # the key of a node's second port in a sweep's question
REACHED = evidence.REACHED


class Liveness:
    """Watches the raylets of the nodes that hold slots (and of the nodes in doubt),
    suspects the silent ones, sweeps the ones that come back, fences the dead ones.

    Attributes:
        self_doubt: whether the controller suspects itself (it reached no majority).
    """

    def __init__(self, ctx: Context, fencer: Fencer) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self.settings = ctx.settings
        self._tasks = ctx.tasks
        self._fencer = fencer
        self._returning = Returning(ctx)
        self._seen: dict[str, evidence.Evidence] = {}
        self.self_doubt = evidence.SelfDoubt()
        s = ctx.settings
        self.witnessing = evidence.Witnessing(
            ctx.io, ctx.tasks, s.liveness_timeout, s.looks, side=self._side
        )
        self._grace: float | None = None
        self._homes: list[str] = []  # where witnesses stand, the last sweep's choice

    # ------------------------------------------------------------ what it shows
    @property
    def cut_off(self) -> dict | None:
        """While the controller suspects itself: since when, what it reached."""
        return self.self_doubt.shown()

    @property
    def grace(self) -> float:
        """How long a suspect may stay silent before it is fenced: the setting, or Ray's
        own detection of a silent node with the cluster's health-check settings."""
        if self._grace is None:
            self._grace = self.settings.fence_grace or self._io.detection_bound()
        return self._grace

    def evidence(self, node: str) -> evidence.Evidence | None:
        return self._seen.get(node)

    # ------------------------------------------------------------ the watch
    def start(self) -> None:
        self._tasks.start("liveness", "watch", self._watch())

    async def _watch(self) -> None:
        took = 0.0
        while True:
            # A sweep every period: one that waited out a silent raylet's timeout
            # counts toward it, so a silence is seen as often as an answer.
            await asyncio.sleep(max(self.settings.liveness_period - took, 0.0))
            started = core.now()
            try:
                watched = self.watched()
                for node in set(self._seen) - watched:  # released: its doubts go too, so
                    del self._seen[node]  # a later reservation there starts afresh
                    self.witnessing.drop(node)
                await self.sweep(watched, judge_self=True)
                self._returning.sweep()
                if not self.self_doubt.doubted:
                    self.keep_witnesses(watched)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("raylet health sweep failed; the next one will run")
            took = core.now() - started

    def keep_witnesses(self, watched: set[str]) -> None:
        """Keep witnesses standing where the next question will ask (the homes), and
        those asking the question in flight wherever they stand: a witness started for a
        question and ended by the next sweep would lose its reply."""
        away = set(self._nodes.in_doubt())
        k = self.settings.witnesses + 1
        self._homes = evidence.homes(watched, self._sample(), away, k, self._side)
        asking = [w for w in self.witnessing.asked() if w not in {*self._homes, *away}]
        self._io.keep_witnesses([*self._homes, *asking], away)

    def watched(self) -> set[str]:
        """The alive nodes holding a slot or a held spare of a settled reservation, and
        the suspects (a suspect whose slots moved away is watched until it answers and is
        swept, or is fenced), but the head and the controller's own. A node only silent
        that holds no slot any more (released) is Ray's to judge."""
        own = self._io.own_node()
        out = {n for n, r in self._nodes.in_doubt().items() if r.phase in doubts.OUT}
        for res in self._state.records.values():
            if res.settled:  # a held spare too: a repair must never take a silent one
                out.update(res.node_ids(), (s.node_id for s in res.spares))
        return {
            n
            for n in out
            if n in self._nodes and n != own and not ((i := self._nodes.info(n)) and i.is_head)
        }

    async def sweep(self, node_ids: set[str], judge_self: bool = False) -> set[str]:
        """Ask each node's raylet once, and the quorum's sample of the cluster beside
        them (:mod:`controller.runtime.core.evidence`); post what each answered; suspect,
        or start the fence of, those the evidence condemns (a caller waits for a fence
        with :meth:`fences`). With ``judge_self`` (the watch's own sweeps, never a
        caller's), the sample's answers say whether the controller suspects itself.
        Returns the nodes whose fence runs."""
        if not node_ids:
            return set()
        sample = set(self._sample())
        asked = set(node_ids) | sample
        addresses = {}
        for n in sorted(asked):
            info = self._nodes.info(n)
            if info is not None and info.raylet:
                addresses[n] = info.raylet
                e = self._seen.get(n)
                if n in node_ids and e is not None and e.refused_at is not None and info.second:
                    addresses[n + _SECOND] = info.second  # a second path, for proof
        if not addresses:
            return set()
        why: dict[str, str] = {}
        doubting = {n for n, e in self._seen.items() if e.silent_since is not None}
        ways = {n: self.settings.looks for n in addresses if n in doubting}
        sent = core.now()
        got = await self._io.node_answers(addresses, self.settings.liveness_timeout, why, ways)
        first = {n: a for n, a in got.items() if not n.endswith(_SECOND)}
        if judge_self:
            heard = [first[n] for n in sample if n in first]
            self._judge_self(sum(a in REACHED for a in heard), len(heard))
        silent: dict[str, str] = {}
        for node in sorted(set(first) & set(node_ids)):
            e = self._seen.setdefault(node, evidence.Evidence())
            e.answer = first[node]
            if e.answer in (OK, DENIED):  # alive, or nothing known: no doubt either way
                self._answered(node, e, sent)
                if e.answer == DENIED:
                    self._fencer.refused_us(node, why.get(node, "refused"))
                continue
            if self.self_doubt.doubted:  # the controller's own silence: no evidence
                e.clear()
                self.witnessing.drop(node)
                continue
            if e.answered_at > sent:  # a sweep that left after this one heard it
                continue
            if e.silent_since is None:
                e.silent_since = sent
            if self._nodes.next_phase(node) in (doubts.HEALTHY, doubts.BACK):
                self._post(node, Kind.SILENT, sent, "its raylet does not answer")
            if e.answer == REFUSED:
                e.refused_at = sent if e.refused_at is None else e.refused_at
                e.second = got.get(node + _SECOND, "")
            else:
                e.refused_at, e.second = None, ""
            silent[node] = addresses[node]
        if not silent:
            return set()
        chosen = evidence.witnesses(
            {n: a for n, a in first.items() if n not in silent}, set(silent),
            self.settings.witnesses, self._side, self._homes,
        )  # fmt: skip
        self.witnessing.ask(silent, chosen)
        now = core.now()
        return {f for node in sorted(silent) if (f := self._judge(node, now, chosen))}

    def _answered(self, node: str, e: evidence.Evidence, sent: float) -> None:
        """``node`` answered the controller: its doubts end; a suspect is back."""
        was = e.silent_since
        e.clear()
        e.answered_at = max(e.answered_at, sent)
        self.witnessing.drop(node)
        if self._nodes.next_phase(node) in (doubts.SILENT, doubts.SUSPECTED, doubts.MOVED):
            lasted = f" after {sent - was:.1f}s" if was is not None else ""
            self._post(node, Kind.ANSWERED, sent, f"its raylet answers again{lasted}")

    def _judge(self, node: str, now: float, chosen: list[str]) -> str:
        """The verdict on silent ``node`` by its evidence and the witnesses' latest
        opinion: fence it (proof, or the grace passed: returns the node), suspect it,
        clear it (a witness reaches it), or wait. Returns "" unless a fence runs."""
        e = self._seen[node]
        since = e.silent_since if e.silent_since is not None else now
        opinion = self.witnessing.since(node, since)
        if opinion is not None and opinion.heard and not opinion.silent:
            e.clear()  # the path from here is at fault, not the node
            self.witnessing.drop(node)
            if not e.detour:
                e.detour = True
                log.warning("node %s is silent to the controller but answers others", node[:12])
            return ""
        proof = self._proof(node, e, now, chosen)
        if proof:
            e.proof = proof
            return self._fencer.fence(node, proof)
        silent_for = now - since
        if silent_for < self.settings.suspect_after:
            return ""
        if opinion is None or not opinion.silent:
            if not chosen or (opinion is not None and not opinion.heard):
                self._unwitnessed(node, chosen)  # nobody replied, or nobody to ask
            return ""
        # Judged by what the watch's own posts make of the node, not by what the view
        # applied last: one suspicion is posted and told once, none of a node fenced.
        if self._nodes.next_phase(node) in (doubts.HEALTHY, doubts.SILENT, doubts.BACK):
            self._suspect(node, opinion.says(silent_for))
        if silent_for >= self.grace:
            why = (
                f"{opinion.says(silent_for)}; its grace of {self.grace:g}s "
                "(Ray's own detection of a silent node) is over"
            )
            return self._fencer.fence(node, why)
        return ""

    def _proof(self, node: str, e: evidence.Evidence, now: float, chosen: list[str]) -> str:
        """Why ``node``'s death is proven, or "": its raylet's port refused to the
        controller for ``refused_confirm``, and to a second path since the first refusal
        (a witness; where no witness replied, the raylet's second port)."""
        if e.proof:
            return e.proof
        if e.refused_at is None or now - e.refused_at < self.settings.refused_confirm:
            return ""
        opinion = self.witnessing.since(node, e.refused_at)
        if opinion is not None and opinion.refused:
            return (
                "its raylet refuses connections, to the controller and to "
                f"{opinion.heard} witness(es): the node's processes are gone"
            )
        nobody = not chosen or (opinion is not None and not opinion.heard)
        if nobody and e.second == REFUSED:
            return (
                "its raylet refuses connections on two of its ports and no other node "
                "could look: the node's processes are gone"
            )
        return ""

    def _suspect(self, node: str, why: str) -> None:
        info = self._nodes.info(node)
        log.warning("node %s suspected: %s", where(node, info), why)
        self._state.told(ev.suspected(node, info.ip if info else "", why + _KEPT))
        self._post(node, Kind.SUSPECTED, core.now(), why)
        if length := self._nodes.flaps.suspected(node, core.now()):  # flapping
            what = self._nodes.flaps.why(length)
            log.warning("node %s held down: %s", where(node, info), what)
            self._state.told(ev.held_down(node, info.ip if info else "", what))

    def _post(self, node: str, kind: Kind, when: float, why: str = "") -> None:
        self._nodes.post(Fact(node=node, kind=kind, source=Source.WATCH, when=when, detail=why))

    def _side(self, node: str) -> str:
        info = self._nodes.info(node)
        if info is None:
            return ""
        t = topology_of(info.labels, info.resources)
        return t.rack or t.domain

    def _sample(self) -> list[str]:
        """The quorum's sample: the same few alive nodes of the whole cluster each sweep
        while it does not change, spread over its racks (:func:`evidence.sample`)."""
        alive = self._nodes.alive_ids()
        heads = {n for n in alive if (i := self._nodes.info(n)) and i.is_head}
        own, k = self._io.own_node(), self.settings.quorum_sample
        return evidence.sample(alive - heads - {own}, k, self._side)

    def _unwitnessed(self, node: str, chosen: list[str]) -> None:
        e = self._seen[node]
        if e.withheld:
            return
        e.withheld = True
        self._io.metrics.fence("withheld")
        log.warning(
            "node %s is silent, but no other node could look at it (%s): not suspected; "
            "Ray's health checks decide",
            node[:12],
            "asked " + ", ".join(w[:12] for w in chosen) if chosen else "none answers",
        )

    def _judge_self(self, reached: int, asked: int) -> None:
        """Suspect the controller itself when a sweep reached no majority (said once a
        time), and trust it again once sweeps reach one (:class:`SelfDoubt`)."""
        was = self.self_doubt.since
        change = self.self_doubt.sample(reached, asked)
        if change:
            what = self.self_doubt.said(change, reached, asked, was)
            if change == "began":
                self._io.metrics.fence("withheld")
            log.log(logging.ERROR if change == "began" else logging.WARNING, "%s", what)
            self._state.told(ev.cut_off(what))

    # ------------------------------------------------------------ callers
    async def check_now(self, node_ids: set[str]) -> None:
        """Ask now (a caller suspects these nodes): a refusing raylet is confirmed on a
        second path within ``settings.refused_confirm`` and fenced; a silent one is
        suspected once silent for ``settings.suspect_after`` and seen silent by
        witnesses (by this call or the watch). Waits for a fence at most
        ``settings.fence_wait``, then settles the node view."""
        ask = {n for n in node_ids if n in self._nodes} & self.watched()
        if ask:
            fencing = await self.sweep(ask)
            # A refusal seen first by an earlier sweep may be confirmed already: only
            # the refusals still unconfirmed wait, for what is left of refused_confirm
            # (a hair more: a timer may fire a tick early) and for the witnesses'
            # question about them.
            refusing = {
                n: e.refused_at
                for n in ask - fencing
                if (e := self._seen.get(n)) is not None and e.refused_at is not None
                and not e.proof
            }  # fmt: skip
            if refusing:
                left = max(refusing.values()) + self.settings.refused_confirm - core.now()
                await asyncio.sleep(max(0.0, left + 0.001))
                question = self.witnessing.asking()
                if question is not None:
                    await asyncio.wait([question], timeout=3 * self.settings.liveness_timeout)
                fencing |= await self.sweep(set(refusing))
            await self._fencer.fences(fencing)
        self._nodes.settle()

    def verdicts(self, node_ids: set[str], holds: set[str]) -> dict[str, str]:
        """What the controller holds of each node for a job whose slots are on the nodes
        ``holds`` now (:mod:`controller.state.verdicts`): ``dead`` (Ray reports it dead,
        it was fenced, or its death is proven), ``moved`` (in doubt, and the job's slots
        left it: its ranks there are lost), ``suspected`` (in doubt, the job's slot not
        moved yet), ``silent`` (no verdict yet), ``unknown`` (it refuses placectl's
        calls, or the controller suspects itself), ``alive``."""
        doubted = self.self_doubt.doubted
        watched = self.watched() if doubted else set()
        out = {}
        for n in node_ids:
            phase, e = self._nodes.phase(n), self._seen.get(n)
            if n not in self._nodes or phase in doubts.FINAL or (e is not None and e.proof):
                out[n] = vd.DEAD
            elif phase in (doubts.SUSPECTED, doubts.MOVED, doubts.BACK) and n not in holds:
                out[n] = vd.MOVED
            elif phase in (doubts.SUSPECTED, doubts.MOVED):
                out[n] = vd.SUSPECTED
            elif n in watched:
                out[n] = vd.UNKNOWN
            elif phase == doubts.SILENT or (e is not None and e.silent_since is not None):
                out[n] = vd.SILENT
            elif e is not None and e.answer == DENIED:
                out[n] = vd.UNKNOWN
            else:
                out[n] = vd.ALIVE
        return out


_KEPT = "; its slots move, the node is kept until it answers or its grace ends"


__all__ = ["REACHED", "Liveness"]
