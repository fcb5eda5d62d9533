"""Nodes that died without a word: found by their raylets' silence, fenced through Ray.

Ray learns that a node died abruptly (its machine lost power, its raylet was killed)
only when the GCS's health checks give up: with Ray's defaults
(``health_check_period_ms=3000``, ``health_check_failure_threshold=5``) 15 s or more,
during which Ray calls the node alive and every call to its workers fails. The
controller does not wait for that. Every ``settings.liveness_period`` it asks the raylet
of each node holding a reservation's slot whether it answers
(:mod:`controller.runtime.edge.answers`), and fences the node through Ray when the answer is
certain:

* a raylet that **refuses** connections, twice ``settings.refused_confirm`` apart, is
  gone (nothing listens on its port);
* a raylet **silent** for ``settings.fence_after`` seconds is stopped, hung or cut off,
  once other nodes confirm it (:mod:`controller.runtime.core.evidence`): a majority of the
  nodes asked answered the controller, and witnesses among them cannot reach it either.
  A controller that reaches no majority suspects itself and fences nothing.

Fencing marks the node dead in Ray's GCS (``ClusterIO.fence``): Ray's node event
follows within milliseconds, and the slot is replaced as after any node loss. The node
never gets its slot back: a fenced raylet that comes back is told it is dead and exits.

A node that is only slow is never fenced: a raylet answers health checks from its gRPC
threads, whatever its tasks do, and one answer clears every doubt. The head node (this
controller's own) is never fenced.

A fence is sent once, and only to a node that needs it: never to one Ray already reports
dead or is draining (a drain ends in the node's removal, and a second ``UnregisterNode``
for a node Ray is removing stalls the GCS's update of it until the call times out), never
twice at once, and a caller waits for it at most ``settings.fence_wait``. A fence that
failed is tried again with a growing delay, and so is one the GCS refused (its token,
its TLS credentials: :mod:`controller.runtime.edge.answers`): a refusal may end when the
operator mends the credentials. An answer of a raylet that refuses placectl is no
evidence of death: the node is not fenced, that is said once (log, event history,
``health()``), and Ray's own health checks decide.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from controller.runtime import core
from controller.runtime.core import evidence
from controller.runtime.core.context import Context
from controller.runtime.edge.answers import DENIED, OK, REFUSED, CallDenied
from controller.state import events as ev

log = logging.getLogger("placectl.controller")

GCS = "gcs"  # the key of a refusal by the GCS (a fence), beside those of raylets
_RETRY_FIRST, _RETRY_MOST = 0.5, 10.0  # a failed fence is tried again after these
REACHED = evidence.REACHED
# The controller's verdict on a node (Liveness.verdicts), read by drivers' repair().
ALIVE, SILENT_NODE, DEAD, UNKNOWN = "alive", "silent", "dead", "unknown"


class Liveness:
    """Watches the raylets of the nodes that hold slots, and fences dead ones.

    Args:
        on_fenced: called with each node fenced, or found dead before its fence (the
            loop is woken to act on it).

    Attributes:
        fenced: node -> why, for the nodes this incarnation fenced.
        denied: node id (or ``gcs``) -> why it refused placectl's calls, this incarnation.
        fence_failures: fences that failed (tried again later), this incarnation.
        cut_off: while the controller suspects itself (it reached no majority), since
            when and how many nodes it reached; ``None`` otherwise.
        withheld: silent nodes not fenced for want of witnesses, each told once until it
            answers again.
        answers: the last answer of each watched node's raylet.
    """

    def __init__(self, ctx: Context, on_fenced: Callable[[str], None]) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self.settings = ctx.settings
        self._tasks = ctx.tasks
        self._on_fenced = on_fenced
        self._silent_since: dict[str, float] = {}  # node -> first unanswered check
        self._refused_at: dict[str, float] = {}  # node -> first refusal in a row
        self._retry_at: dict[str, tuple[float, int]] = {}  # node -> (not before, failures)
        self.fenced: dict[str, str] = {}
        self.denied: dict[str, str] = {}
        self.fence_failures = 0
        self.cut_off: dict | None = None
        self.withheld: set[str] = set()
        self.answers: dict[str, str] = {}
        s = ctx.settings
        self.witnessing = evidence.Witnessing(ctx.io, ctx.tasks, s.liveness_timeout, s.looks)

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
                doubts = (self._silent_since, self._refused_at, self._retry_at, self.answers)
                for doubt in (*doubts, self.witnessing.latest):
                    for node in set(doubt) - watched:  # released: its doubts go too, so
                        del doubt[node]  # a later reservation there starts afresh
                await self.sweep(watched)
                if self.cut_off is None:
                    self._io.keep_witnesses(self._witness_homes(watched))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("raylet health sweep failed; the next one will run")
            took = core.now() - started

    def watched(self) -> set[str]:
        """The alive nodes holding a slot of a settled reservation, but the head."""
        own = self._io.own_node()
        out = set()
        for res in self._state.records.values():
            if res.settled:
                out.update(n for n in res.node_ids() if n in self._nodes and n != own)
        return {n for n in out if not (info := self._nodes.info(n)) or not info.is_head}

    async def sweep(self, node_ids: set[str]) -> set[str]:
        """Ask each node's raylet once, and a few others beside them (the quorum,
        :mod:`controller.runtime.core.evidence`); start the fence of those certainly gone (a
        caller waits for it with :meth:`fences`). Returns the nodes whose fence runs."""
        started = core.now()
        if not node_ids:
            return set()
        asked = set(node_ids) | set(self._bystanders(node_ids))
        addresses = {}
        for n in sorted(asked):
            info = self._nodes.info(n)
            if info is not None and info.raylet:
                addresses[n] = info.raylet
        if not addresses:
            return set()
        why: dict[str, str] = {}
        ways = {n: self.settings.looks for n in addresses if n in self._silent_since}
        got = await self._io.node_answers(addresses, self.settings.liveness_timeout, why, ways)
        now = core.now()
        self.answers.update({n: a for n, a in got.items() if n in node_ids})
        self._judge_self(sum(a in REACHED for a in got.values()), len(got))
        fencing = set()
        for node in sorted(set(got) & set(node_ids)):
            answer = got[node]
            if answer in (OK, DENIED):  # alive, or nothing known: no doubt either way
                self._silent_since.pop(node, None)
                self._refused_at.pop(node, None)
                self.witnessing.drop(node)
                self.withheld.discard(node)  # a later silence is told again
                if answer == DENIED:
                    self._refused_us(node, why.get(node, "refused"))
                continue
            if answer == REFUSED:  # the host's own kernel says nothing listens there
                since = self._silent_since.setdefault(node, started)
                first = self._refused_at.setdefault(node, now)
                if now - first >= self.settings.refused_confirm and now > first:
                    why_ = "its raylet refuses connections (the node's processes are gone)"
                    fencing.add(self._fence(node, why_))
                    continue
            else:
                self._refused_at.pop(node, None)
                if self.cut_off is not None:  # the controller's own silence: no evidence
                    self._silent_since.pop(node, None)
                    self.witnessing.drop(node)
                    continue
                since = self._silent_since.setdefault(node, started)
                if self._second_opinion(node, since, now, got, addresses) and (
                    now - since >= self.settings.fence_after
                ):
                    fencing.add(self._fence(node, self._why_silent(node, now - since)))
                continue
            if now - since >= self.settings.fence_after:  # refused, not twice yet
                why_ = f"its raylet has not answered for {now - since:.1f}s"
                fencing.add(self._fence(node, why_))
        return fencing - {""}

    def _second_opinion(
        self, node: str, since: float, now: float, got: dict[str, str], addresses: dict[str, str]
    ) -> bool:
        """Whether the witnesses' latest opinion on silent ``node`` (asked since its
        silence began) is that none of them reaches it either; asks them again. One that
        reaches it ends the doubt."""
        opinion = self.witnessing.since(node, since)
        if opinion is not None and opinion.heard and not opinion.silent:
            self._silent_since.pop(node, None)  # the path from here is at fault
            self.witnessing.drop(node)
            log.warning("node %s is silent to the controller but answers others", node[:12])
            return False
        silent = set(self._silent_since)
        chosen = evidence.witnesses(got, silent, self.settings.witnesses)
        self.witnessing.ask(node, addresses[node], chosen)
        if opinion is not None and opinion.silent:
            return True
        if now - since >= self.settings.fence_after and (opinion is not None or not chosen):
            self._unwitnessed(node, chosen)  # nobody replied, or nobody to ask
        return False

    def _why_silent(self, node: str, silent_for: float) -> str:
        o = self.witnessing.latest[node]
        seen = f"{o.heard} of {o.asked} other node(s) cannot reach it either"
        return f"its raylet has not answered for {silent_for:.1f}s; {seen}"

    def _witness_homes(self, watched: set[str]) -> list[str]:
        """Where witnesses stand: the same few nodes while the cluster does not change
        (one more than are asked at a time, for when one of them is the suspect); none
        while nothing is watched."""
        if not watched:
            return []
        k = self.settings.witnesses + 1
        return sorted(watched | set(self._bystanders(watched)))[:k]

    def _bystanders(self, watched: set[str]) -> list[str]:
        heads = {n for n in self._nodes.alive_ids() if (i := self._nodes.info(n)) and i.is_head}
        own = self._io.own_node()
        k = self.settings.quorum_sample
        return evidence.bystanders(self._nodes.alive_ids(), watched, own, heads, k)

    def _unwitnessed(self, node: str, chosen: list[str]) -> None:
        if node in self.withheld:
            return
        self.withheld.add(node)
        self._io.metrics.fence("withheld")
        log.warning(
            "node %s is silent, but no other node could look at it (%s): not fenced; "
            "Ray's health checks decide",
            node[:12],
            "asked " + ", ".join(w[:12] for w in chosen) if chosen else "none answers",
        )

    def _judge_self(self, reached: int, asked: int) -> None:
        """Suspect the controller itself when it reached no majority (said once a
        time), and trust it again once it does."""
        if evidence.cut_off(reached, asked):
            if self.cut_off is None:
                self.cut_off = {"since": core.wall(), "reached": reached, "asked": asked}
                self._io.metrics.fence("withheld")
                what = (
                    f"the controller reaches {reached} of {asked} node(s) it asked: it "
                    "suspects itself and fences no silent node; Ray's health checks decide"
                )
                log.error("%s", what)
                self._state.told(ev.cut_off(what))
            return
        if self.cut_off is not None:
            lasted = core.wall() - self.cut_off["since"]
            self.cut_off = None
            what = f"the controller reaches {reached} of {asked} node(s) again after {lasted:.1f}s"
            log.warning("%s", what)
            self._state.told(ev.cut_off(what))

    async def check_now(self, node_ids: set[str]) -> dict[str, str]:
        """Ask now (a caller suspects these nodes): a refusing raylet is confirmed and
        fenced within ``settings.refused_confirm``; a silent one is fenced once silent
        for ``settings.fence_after`` and seen silent by witnesses (by this call or the
        watch). Waits for a fence at most ``settings.fence_wait``. Returns the verdict
        on each of ``node_ids`` (:meth:`verdicts`)."""
        ask = {n for n in node_ids if n in self._nodes} & self.watched()
        if ask:
            fencing = await self.sweep(ask)
            # A refusal seen first by an earlier sweep is confirmed already (its fence
            # runs): only the refusals still unconfirmed wait, and only for what is left
            # of ``refused_confirm`` (a hair more: a timer may fire a tick early).
            first = [
                at
                for n in ask - fencing - set(self.fenced)
                if n in self._nodes and (at := self._refused_at.get(n)) is not None
            ]
            if first:
                left = max(first) + self.settings.refused_confirm - core.now()
                await asyncio.sleep(max(0.0, left + 0.001))
                fencing |= await self.sweep({n for n in ask if n in self._refused_at})
            await self.fences(fencing)
        return self.verdicts(node_ids)

    def verdicts(self, node_ids: set[str]) -> dict[str, str]:
        """What the controller holds of each node now: ``dead`` (Ray reports it dead,
        it was fenced, or its raylet refuses connections, confirmed: a fence the GCS
        refuses changes nothing of that), ``silent`` (its raylet does not answer; no verdict yet),
        ``unknown`` (it refuses placectl's calls, or the controller suspects itself),
        ``alive`` (it answered, or it is not watched: the head, a node without slots)."""
        watched = self.watched() if self.cut_off is not None else set()
        now = core.now()
        out = {}
        for n in node_ids:
            refused = self._refused_at.get(n)
            if n not in self._nodes or n in self.fenced:
                out[n] = DEAD
            elif refused is not None and now - refused >= self.settings.refused_confirm:
                out[n] = DEAD  # its host says nothing listens there, fenced or not yet
            elif n in self._silent_since:
                out[n] = SILENT_NODE
            elif n in watched or self.answers.get(n) == DENIED:
                out[n] = UNKNOWN
            else:
                out[n] = ALIVE
        return out

    async def fences(self, nodes: set[str]) -> None:
        """Wait for the fences of ``nodes`` in flight, at most ``settings.fence_wait``:
        a fence the GCS is slow to answer runs on without holding its caller."""
        running = [t for n in nodes if (t := self._tasks.get("fence", n)) is not None]
        if running:
            await asyncio.wait(running, timeout=self.settings.fence_wait)

    def _fence(self, node: str, why: str) -> str:
        """Start fencing ``node`` unless it is fenced, being fenced, waiting to be tried
        again, or placectl may not fence; returns the node if its fence runs."""
        if node in self.fenced:
            return ""
        if self._tasks.get("fence", node) is None:
            if core.now() < self._retry_at.get(node, (0.0, 0))[0]:
                return ""
            self._tasks.start("fence", node, self._fence_once(node, why))
        return node

    async def _fence_once(self, node: str, why: str) -> None:
        info = self._nodes.info(node)
        where = f"{info.ip} ({node[:12]})" if info else node[:12]
        try:
            if node in await self._io.dead_nodes([node]):
                self._gone(node)  # Ray knows already: its node event follows
                return
            if node in await self._io.draining_nodes():
                return  # Ray is taking it away; the drain watch moves its slots
            await self._io.fence(node, f"placectl fenced the node: {why}")
        except Exception as e:
            if isinstance(e, CallDenied):  # said once; tried again, in case it is mended
                self._refused_us(GCS, str(e))
            failures = self._retry_at.get(node, (0.0, 0))[1] + 1
            delay = min(_RETRY_FIRST * 2 ** (failures - 1), _RETRY_MOST)
            self._retry_at[node] = (core.now() + delay, failures)
            self.fence_failures += 1
            if not isinstance(e, CallDenied):  # a refusal is counted once, as denied
                self._io.metrics.fence("failed")
            log.warning(
                "could not fence node %s (try %d, next in %.1fs): %s", where, failures, delay, e
            )
            return
        log.warning("node %s fenced: %s", where, why)
        self.denied.pop(GCS, None)  # the GCS takes placectl's fences (again)
        self.fenced[node] = why
        self._io.metrics.fence("fenced")
        self._state.told(ev.fenced(node, info.ip if info else "", why))
        self._gone(node)

    def _gone(self, node: str) -> None:
        self.witnessing.drop(node)
        self.withheld.discard(node)
        self._silent_since.pop(node, None)
        self._refused_at.pop(node, None)
        self._retry_at.pop(node, None)
        self._nodes.died(node)
        with contextlib.suppress(Exception):
            self._on_fenced(node)

    def _refused_us(self, key: str, why: str) -> None:
        """``key`` (a node, or the GCS) refused placectl's own calls: said once."""
        if key in self.denied:
            return
        self.denied[key] = why
        self._io.metrics.fence("denied")
        what = (
            "the GCS refuses placectl's fence"
            if key == GCS
            else f"node {key[:12]}'s raylet refuses placectl's health checks"
        )
        log.error(
            "%s (%s): placectl's own fault detection is off there, Ray's health checks decide. "
            "Its calls carry the cluster's token and TLS settings as Ray's clients do: check "
            "them in the controller's environment",
            what,
            why,
        )
        self._state.told(ev.denied(key, why))
