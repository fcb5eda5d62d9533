"""Ray's node events: who joined and who died, pushed by the GCS, across GCS restarts.

The controller's loop drains them (``ClusterIO.node_events``) and waits on them
(``ClusterIO.wait_for_events``). They come from Ray's node-info subscription; while no
subscription holds (before the first, after the GCS went away, or with a Ray that has
none) they come from comparing the alive set of one read of the node table with the last.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable

import ray

from controller.runtime import edge

log = logging.getLogger("placectl.controller")


class NodeEvents:
    """Ray's node events, as they arrive, until taken.

    Args:
        read_nodes: reads Ray's node table (a coroutine function).
    """

    def __init__(self, read_nodes: Callable[[], Awaitable[list[edge.NodeInfo]]]) -> None:
        self._read_nodes = read_nodes
        self._events: collections.deque[edge.NodeEvent] = collections.deque()
        self._arrived: asyncio.Event | None = None  # set while events wait to be taken
        self._watch: asyncio.Task | None = None
        self._alive: set[str] | None = None  # the alive set last seen
        self._polling = False
        self._subscribed = False
        self._resubscriptions = 0

    async def take(self) -> list[edge.NodeEvent]:
        """The events since the last call, in order; the subscription starts at the
        first call."""
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._subscribe())
        if self._polling or not self._subscribed:
            await self._poll_nodes()  # no subscription (yet, or again): compare alive sets
        out = list(self._events)
        self._events.clear()
        if self._arrived is not None:
            self._arrived.clear()
        return out

    async def wait(self, timeout: float) -> None:
        """Return as soon as an event waits to be taken, or after ``timeout``."""
        if self._arrived is None:
            self._arrived = asyncio.Event()
        polling = self._polling or not self._subscribed
        if self._events or polling:  # polling learns of events only when asked
            if polling:
                await asyncio.sleep(timeout)
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), timeout)

    def watching(self) -> str:
        """How node events arrive: ``subscribed`` (pushed by the GCS), ``reconnecting``
        (no subscription yet or again: alive sets are compared on every tick meanwhile,
        and once more on subscribing), or ``polling`` (this Ray has no subscriber)."""
        if self._polling:
            return "polling"
        return "subscribed" if self._subscribed else "reconnecting"

    async def _subscribe(self) -> None:
        """Follow Ray's node-info channel, pushed by the GCS, across GCS restarts.

        A restarted GCS does not know the old subscription: the long poll then answers
        at once with nothing, forever (measured on Ray 2.60). An empty answer therefore
        means the GCS went away: the subscriber is dropped and made anew (with backoff),
        and the nodes whose state changed meanwhile become events, from one read of the
        node table compared with the alive set last seen (read after subscribing, so no
        change falls in between).
        """
        try:
            from ray._private.gcs_pubsub import GcsAioNodeInfoSubscriber
        except ImportError as e:
            log.warning("node-info subscription unavailable (%s); polling node states", e)
            self._polling = True
            return
        address = ray.get_runtime_context().gcs_address
        backoff = 0.1
        while True:
            sub = None
            try:
                sub = GcsAioNodeInfoSubscriber(address=address)
                await sub.subscribe()
                await self._poll_nodes()  # what changed while nobody listened
                self._wake()
                if self._resubscriptions:
                    log.warning("node events: subscribed again after the GCS came back")
                self._subscribed = True
                self._resubscriptions += 1
                backoff = 0.1
                while True:
                    got = await sub.poll(batch_size=1000)
                    if not got:
                        break
                    for node_id, info in got:
                        self._event(edge.NodeEvent(bytes(node_id).hex(), info.state == 0))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.info("node-info subscription: %s", e)
            if self._subscribed:
                log.warning("node events: the GCS went away; subscribing again")
            self._subscribed = False
            if sub is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(sub.close(), 1.0)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def _event(self, event: edge.NodeEvent) -> None:
        if self._alive is not None:
            (self._alive.add if event.alive else self._alive.discard)(event.node_id)
        self._events.append(event)
        self._wake()

    def _wake(self) -> None:
        if self._events and self._arrived is not None:
            self._arrived.set()

    async def _poll_nodes(self) -> None:
        alive = {n.node_id for n in await self._read_nodes() if n.alive}
        if self._alive is not None:
            self._events.extend(edge.NodeEvent(n, False) for n in sorted(self._alive - alive))
            self._events.extend(edge.NodeEvent(n, True) for n in sorted(alive - self._alive))
        self._alive = alive


__all__ = ["NodeEvents"]
