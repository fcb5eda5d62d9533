"""A suspect that answers again is not lost: what the ranks moved off it left there is
ended, then it is free for placement again, with the same raylet.

While a node was in doubt (:mod:`controller.runtime.core.doubts`), its reservations'
slots moved to other nodes; their old groups were kept, untouched, while the node was
away (:class:`controller.state.records.LeavingGroup`). Ray's GCS reaches a node's raylet
again only after its connection's backoff: measured on hosts in network namespaces (Ray
2.60), a group removed during an 8 s cut had its ranks ended 6.6 s after the heal; one
removed during or right after a 30 s cut, 28 s after it, its GPUs held all the while. A
task on the node reaches it within about 3 s of the heal. So when a node with such ranks
(``owed``) answers the controller again (``back``), its kept groups are removed, and one
task on it ends every process of those reservations there, Ray's workers included, read
from the node's own process table; the node is then swept (``swept``) and healthy. Ray
frees the groups' resources there when its GCS reaches the node.
"""

from __future__ import annotations

import asyncio
import logging

from controller.runtime import core
from controller.runtime.core import doubts, groups
from controller.runtime.core.context import Context
from controller.runtime.core.inbox import Fact, Kind, Source
from controller.state import events as ev
from controller.state.records import UNTIL_BACK

log = logging.getLogger("placectl.controller")


class Returning:
    """Ends, on each node back, what the ranks moved off it left there."""

    def __init__(self, ctx: Context) -> None:
        self._io, self._state, self._nodes = ctx.io, ctx.state, ctx.nodes
        self.settings = ctx.settings
        self._tasks = ctx.tasks

    def sweep(self) -> None:
        """Start the sweep of each node back, one at a time per node; a sweep that could
        not reach its node is started again by a later call."""
        for node, record in self._nodes.in_doubt().items():
            if record.phase == doubts.BACK and node in self._nodes:
                self._tasks.start("back", node, self._end_owed(node, record))

    async def _end_owed(self, node: str, record: doubts.NodeRecord) -> None:
        """Remove the old groups kept on ``node`` while it was away (Ray ends their
        workers, and can no longer restart an actor into them), end every process of the
        reservations ``record.owed`` there, Ray's workers included, then say the node is
        swept."""
        started = core.now()
        ended: list[str] = []
        kept = {
            x.group_id
            for res in self._state.records.values()
            for x in res.leaving
            if x.node_id == node and x.remove_at == UNTIL_BACK
        }
        try:
            await groups.remove_verified(self._io, kept, self.settings.removal_timeout)
            for uid in sorted(record.owed):
                ended += await asyncio.wait_for(
                    self._io.end_leftovers(node, uid, ray_workers=True),
                    self.settings.leftovers_timeout,
                )
        except Exception as e:  # silent again, or gone: the next sweep decides
            log.info("ending what moved ranks left on node %s: %r; tried again", node[:12], e)
            return
        info = self._nodes.info(node)
        for command in ended:
            log.warning("ended %s on node %s: left by a rank moved off it", command, node[:12])
        uids = ",".join(sorted(record.owed))
        swept = Fact(node=node, kind=Kind.SWEPT, source=Source.WATCH, when=started, detail=uids)
        self._nodes.post(swept)
        self._nodes.settle()
        what = (
            f"it answers again; ended {len(ended)} process(es) the ranks moved off it "
            "left there; free for placement again, with the same raylet"
        )
        log.warning("node %s is back: %s", where(node, info), what)
        self._state.told(ev.back(node, info.ip if info else "", what))


def where(node: str, info) -> str:
    """A node for people: its address and the start of its id."""
    return f"{info.ip} ({node[:12]})" if info else node[:12]


__all__ = ["Returning", "where"]
