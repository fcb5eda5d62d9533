"""Fencing: telling Ray a node is dead, which it never comes back from.

A fence marks the node dead in Ray's GCS (``ClusterIO.fence``, the call a raylet makes
when it leaves): Ray's node event follows within milliseconds, the node's actors are
dead, its slots are replaced as after any node loss, and its raylet, told it is dead
when it reconnects, exits. It is asked for by the raylet watch, on proof or after a
suspect's grace (:mod:`controller.runtime.steps.liveness`), and by an operator
(``placectl fence NODE``); both take this one road: recorded in the event history,
counted (``placectl_fences``), and posted to the node view as a fact.

A fence is sent once, and only to a node that needs it: never to one Ray already reports
dead, never (by the watch) to one Ray is draining (a drain ends in the node's removal,
and a second ``UnregisterNode`` for a node Ray is removing stalls the GCS's update of it
until the call times out), never twice at once, and a caller waits for it at most
``settings.fence_wait``. A fence that failed is tried again with a growing delay, and
so is one the GCS refused (its token, its TLS credentials:
:mod:`controller.runtime.edge.answers`): a refusal may end when the operator mends the
credentials. Who refused placectl's own calls is said once (log, event, ``health()``).
"""

from __future__ import annotations

import asyncio
import logging

from controller.runtime import core
from controller.runtime.core import doubts
from controller.runtime.core.context import Context
from controller.runtime.core.inbox import Fact, Kind, Source
from controller.runtime.edge.answers import CallDenied
from controller.state import events as ev

log = logging.getLogger("placectl.controller")

GCS = "gcs"  # the key of a refusal by the GCS (a fence), beside those of raylets
_RETRY_FIRST, _RETRY_MOST = 0.5, 10.0  # a failed fence is tried again after these


class Fencer:
    """Fences nodes, once each, and keeps who refused placectl's calls.

    Attributes:
        denied: node id (or ``gcs``) -> why it refused placectl's calls, this incarnation.
        failures: fences that failed (tried again later), this incarnation.
    """

    def __init__(self, ctx: Context) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self.settings = ctx.settings
        self._tasks = ctx.tasks
        self._retry: dict[str, tuple[float, int]] = {}  # node -> (not before, failures)
        self.denied: dict[str, str] = {}
        self.failures = 0

    @property
    def fenced(self) -> dict[str, str]:
        """Node -> why, for the nodes placectl fenced (the watch or an operator)."""
        return {n: r.fenced for n, r in self._nodes.records().items() if r.fenced}

    def fence(self, node: str, why: str, source: Source = Source.WATCH) -> str:
        """Start fencing ``node`` unless it is fenced, being fenced, waiting to be tried
        again, or placectl may not fence; returns the node if its fence runs."""
        if self._nodes.phase(node) in doubts.FINAL:
            return ""
        if self._tasks.get("fence", node) is None:
            if core.now() < self._retry.get(node, (0.0, 0))[0]:
                return ""
            self._tasks.start("fence", node, self._fence_once(node, why, source))
        return node

    async def fences(self, nodes: set[str]) -> None:
        """Wait for the fences of ``nodes`` in flight, at most ``settings.fence_wait``:
        a fence the GCS is slow to answer runs on without holding its caller."""
        running = [t for n in nodes if (t := self._tasks.get("fence", n)) is not None]
        if running:
            await asyncio.wait(running, timeout=self.settings.fence_wait)

    async def fence_now(self, node: str, why: str) -> None:
        """The operator's fence: tell Ray ``node`` is dead now, as the watch's fences
        are told (recorded, counted, posted to the node view), and settle the view.

        Raises:
            Exception: Ray refused or failed the fence (the caller says so).
        """
        await self._fence_once(node, why, Source.OPERATOR, raise_errors=True)
        self._nodes.settle()

    async def _fence_once(
        self, node: str, why: str, source: Source, raise_errors: bool = False
    ) -> None:
        info = self._nodes.info(node)
        where = f"{info.ip} ({node[:12]})" if info else node[:12]
        try:
            sent = core.now()
            if node in await self._io.dead_nodes([node]):  # Ray knows already
                self._nodes.post(Fact(node=node, kind=Kind.DIED, source=Source.RAY_READ, when=sent))
                return
            if source == Source.WATCH and node in await self._io.draining_nodes():
                return  # Ray is taking it away; the drain watch moves its slots
            await self._io.fence(node, f"placectl fenced the node: {why}")
        except Exception as err:
            if isinstance(err, CallDenied):  # said once; tried again, in case it is mended
                self.refused_us(GCS, str(err))
            failures = self._retry.get(node, (0.0, 0))[1] + 1
            delay = min(_RETRY_FIRST * 2 ** (failures - 1), _RETRY_MOST)
            self._retry[node] = (core.now() + delay, failures)
            self.failures += 1
            if not isinstance(err, CallDenied):  # a refusal is counted once, as denied
                self._io.metrics.fence("failed")
            log.warning(
                "could not fence node %s (try %d, next in %.1fs): %s", where, failures, delay, err
            )
            if raise_errors:
                raise
            return
        log.warning("node %s fenced: %s", where, why)
        self._retry.pop(node, None)
        self.denied.pop(GCS, None)  # the GCS takes placectl's fences (again)
        self._io.metrics.fence("fenced")
        self._state.told(ev.fenced(node, info.ip if info else "", why))
        fact = Fact(node=node, kind=Kind.FENCED, source=source, when=core.now(), detail=why)
        self._nodes.post(fact)

    def refused_us(self, key: str, why: str) -> None:
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


__all__ = ["GCS", "Fencer"]
