"""Nodes that died without a word: found by their raylets' silence, fenced through Ray.

Ray learns that a node died abruptly (its machine lost power, its raylet was killed)
only when the GCS's health checks give up: with Ray's defaults
(``health_check_period_ms=3000``, ``health_check_failure_threshold=5``) 15 s or more,
during which Ray calls the node alive and every call to its workers fails. The
controller does not wait for that. Every ``settings.liveness_period`` it asks the raylet
of each node holding a reservation's slot whether it answers
(:mod:`controller.runtime.answers`), and fences the node through Ray when the answer is
certain:

* a raylet that **refuses** connections, twice ``settings.refused_confirm`` apart, is
  gone (nothing listens on its port);
* a raylet **silent** for ``settings.fence_after`` seconds is stopped, hung or cut off.

Fencing marks the node dead in Ray's GCS (``ClusterIO.fence``): Ray's node event
follows within milliseconds, and the slot is replaced as after any node loss. The node
never gets its slot back: a fenced raylet that comes back is told it is dead and exits.

A node that is only slow is never fenced: a raylet answers health checks from its gRPC
threads, whatever its tasks do, and one answer clears every doubt. The head node (this
controller's own) is never fenced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from controller.runtime.answers import OK, REFUSED
from controller.runtime.context import Context

log = logging.getLogger("placectl.controller")


class Liveness:
    """Watches the raylets of the nodes that hold slots, and fences dead ones.

    Args:
        on_fenced: called with each node fenced (the loop is woken to act on it).
    """

    def __init__(self, ctx: Context, on_fenced: Callable[[str], None]) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self.settings = ctx.settings
        self._tasks = ctx.tasks
        self._on_fenced = on_fenced
        self._silent_since: dict[str, float] = {}  # node -> first unanswered check
        self._refused_at: dict[str, float] = {}  # node -> first refusal in a row
        self.fenced: dict[str, str] = {}  # node -> why (this incarnation)

    def start(self) -> None:
        self._tasks.start("liveness", "watch", self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.liveness_period)
            try:
                watched = self.watched()
                for doubts in (self._silent_since, self._refused_at):
                    for node in set(doubts) - watched:  # released: its doubts go too, so
                        del doubts[node]  # a later reservation there starts afresh
                await self.sweep(watched)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("raylet health sweep failed; the next one will run")

    def watched(self) -> set[str]:
        """The alive nodes holding a slot of a settled reservation, but the head."""
        own = self._io.own_node()
        out = set()
        for res in self._state.records.values():
            if res.settled:
                out.update(n for n in res.node_ids() if n in self._nodes and n != own)
        return {n for n in out if not (info := self._nodes.info(n)) or not info.is_head}

    async def sweep(self, node_ids: set[str]) -> set[str]:
        """Ask each node's raylet once; fence those that are certainly gone. Returns
        the nodes fenced."""
        addresses = {}
        for n in sorted(node_ids):
            info = self._nodes.info(n)
            if info is not None and info.raylet:
                addresses[n] = info.raylet
        if not addresses:
            return set()
        got = await self._io.node_answers(addresses, self.settings.liveness_timeout)
        now = time.monotonic()
        fenced = set()
        for node, answer in got.items():
            if answer == OK:
                self._silent_since.pop(node, None)
                self._refused_at.pop(node, None)
                continue
            since = self._silent_since.setdefault(node, now)
            if answer == REFUSED:
                first = self._refused_at.setdefault(node, now)
                if now - first >= self.settings.refused_confirm and now > first:
                    why = "its raylet refuses connections (the node's processes are gone)"
                    fenced.add(await self._fence(node, why))
                    continue
            else:
                self._refused_at.pop(node, None)
            if now - since >= self.settings.fence_after:
                why = f"its raylet has not answered for {now - since:.1f}s"
                fenced.add(await self._fence(node, why))
        return fenced - {""}

    async def check_now(self, node_ids: set[str]) -> set[str]:
        """Ask now (a caller suspects these nodes): a refusing raylet is confirmed and
        fenced within ``settings.refused_confirm``; a silent one is fenced once silent
        for ``settings.fence_after`` (by this call or the watch). Returns the nodes that
        do not answer and are not fenced yet (suspects)."""
        ask = {n for n in node_ids if n in self._nodes} & self.watched()
        if not ask:
            return set()
        await self.sweep(ask)
        refused = {n for n in ask if n in self._refused_at and n in self._nodes}
        if refused:
            await asyncio.sleep(self.settings.refused_confirm)
            await self.sweep(refused)
        return {n for n in ask if n in self._silent_since and n in self._nodes}

    async def _fence(self, node: str, why: str) -> str:
        """Fence ``node`` once: concurrent sweeps await the one call in flight. Two
        ``UnregisterNode`` calls for one node at once stall the GCS's update of it until
        the second times out (measured on Ray 2.60: dead after 10 s instead of 0.06 s)."""
        if node in self.fenced:
            return node
        return await asyncio.shield(self._tasks.start("fence", node, self._fence_once(node, why)))

    async def _fence_once(self, node: str, why: str) -> str:
        info = self._nodes.info(node)
        where = f"{info.ip} ({node[:12]})" if info else node[:12]
        message = f"placectl fenced the node: {why}"
        try:
            await self._io.fence(node, message)
        except Exception as e:
            log.warning("could not fence node %s: %s", where, e)
            return ""
        log.warning("node %s fenced: %s", where, why)
        self.fenced[node] = why
        self._silent_since.pop(node, None)
        self._refused_at.pop(node, None)
        self._nodes.died(node)
        with contextlib.suppress(Exception):
            self._on_fenced(node)
        return node
