"""**Demand**: what placectl shows the cluster's autoscaler, held as placement groups.

Each owner (a reserve waiting for nodes, a reservation whose lost or draining slot has no
spare) states what it wants as a :class:`~controller.state.wants.Want`; this module
holds it as placement groups Ray reports as pending demand, which an autoscaler (Ray's,
KubeRay's) reads to add nodes. Their selectors keep them off every live node that could
hold them, so one is placed only on a node that joined for it. Then it has done its
work: :meth:`Demand.settle` removes it, waits until Ray reports its resources free, and
the owner uses the node as any other. Nothing placectl holds keeps a node once the
reservation that wanted it is placed, released or cancelled.

The groups are not detached: a controller that dies takes them with it, and the one
that comes back states its demand again from what it finds. Their names start with
``placectl-demand:``, outside every controller's prefix, so no orphan sweep sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from controller.ray_versions import DEMAND_SELECTORS, has, refusal
from controller.runtime import core
from controller.runtime.core.nodes import ClusterNodes
from controller.runtime.edge import CREATED, ClusterIO
from controller.state.wants import Want

log = logging.getLogger("placectl.controller")
DEMAND_PREFIX = "placectl-demand:"


class Demand:
    """What each owner asks the autoscaler for, by key (``nodes/JOB``, ``spare/JOB``).

    Args:
        io: the cluster.
        nodes: the nodes as Ray last reported them, refreshed when a demand is placed.
        name: the controller's name, in the groups' names.
        grace: after a demand was placed, its owner gets this long to use the node
            before the same key asks again (else a node Ray reports free a moment late
            would be asked for twice).
        free_wait: how long :meth:`settle` waits for Ray to report a placed demand's
            resources free again once it is removed.
    """

    def __init__(
        self,
        io: ClusterIO,
        nodes: ClusterNodes,
        name: str,
        grace: float = 10.0,
        free_wait: float = 5.0,
    ) -> None:
        self._io = io
        self._nodes = nodes
        self._name = name
        self._grace = grace
        self._free_wait = free_wait
        self._wants: dict[str, Want] = {}
        self._held: dict[str, list[str]] = {}  # key -> group ids stating its want
        self._placed_at: dict[str, float] = {}  # key -> when a demand of it was placed
        self._refused: set[str] = set()  # keys told that this Ray cannot state demand
        self.asked = 0  # groups created, ever (metrics, tests)
        self.met = 0  # groups placed on a node that joined for them

    def refused(self) -> str | None:
        """Why this cluster's Ray cannot be shown demand, or None if it can."""
        release = self._io.ray_version()
        return None if has(DEMAND_SELECTORS, release) else refusal(DEMAND_SELECTORS, release)

    def wants(self) -> dict[str, Want]:
        """Every want held now, by key."""
        return {k: w for k, w in self._wants.items() if self._held.get(k)}

    def held(self, key: str) -> Want | None:
        """The want ``key`` holds as groups now, if any."""
        return self._wants.get(key) if self._held.get(key) else None

    async def want(self, key: str, want: Want | None) -> None:
        """Hold ``want`` for ``key`` (None withdraws it). The same want again changes
        nothing; another replaces the groups."""
        if want is None or not want.groups:
            await self.withdraw(key)
            return
        refused = self.refused()
        if refused is not None:
            # Ray would place the groups on live nodes (it ignores their selectors) and
            # hold their room: the owner waits for nodes without asking for them.
            if key not in self._refused:
                self._refused.add(key)
                log.warning("not asking the autoscaler for %s: %s", key, refused)
            return
        held = self._wants.get(key)
        if held is not None and self._held.get(key) and _same_but_avoid(held, want):
            return  # only nodes that joined since differ: the groups asked stand (one of
            # those may be the node they asked for, its resources not reported yet)
        if core.now() - self._placed_at.get(key, float("-inf")) < self._grace:
            return  # a node joined for this key a moment ago: its owner uses it first
        await self.withdraw(key)
        ids: list[str] = []
        self._wants[key], self._held[key] = want, ids
        tag = secrets.token_hex(3)
        for i, group in enumerate(want.groups):
            ids.append(
                await self._io.create_demand(f"{DEMAND_PREFIX}{self._name}:{key}:{tag}:{i}", group)
            )
        self.asked += len(ids)
        log.info("asking the autoscaler for %s (%s): %s", key, want.why, want.describe())

    async def settle(self, key: str) -> bool:
        """If a group of ``key`` was placed (a node joined for it), remove every group
        of ``key``, wait until Ray reports the node alive and the group's resources free
        there, and return True: the owner finds the node as any other and asks again
        for what is still missing."""
        ids = self._held.get(key)
        if not ids:
            return False
        table = await self._io.groups(ids)
        want = self._wants[key]
        freed: dict[str, dict[str, float]] = {}  # node -> what the placed groups held
        for gid, group in zip(ids, want.groups, strict=True):
            info = table.get(gid)
            if info is None or info.state != CREATED:
                continue
            for node, bundle in zip(info.nodes, group.bundles, strict=True):
                held = freed.setdefault(node, {})
                for k, v in bundle.items():
                    held[k] = held.get(k, 0.0) + v
        if not freed:
            return False
        self._placed_at[key] = core.now()
        self.met += 1
        await self.withdraw(key)
        await self._nodes.refresh()
        await self._wait_free(freed)
        log.info("demand %s was met on node(s) %s", key, ", ".join(n[:12] for n in sorted(freed)))
        return True

    async def _wait_free(self, freed: dict[str, dict[str, float]]) -> None:
        await wait_free(self._io, freed, self._free_wait)

    async def placed(self) -> list[str]:
        """The keys with a group placed now (a node joined for them): their owners can
        act at once instead of at their next retry. One read of the held groups."""
        ids = {gid: key for key, held in self._held.items() for gid in held}
        if not ids:
            return []
        table = await self._io.groups(sorted(ids))
        return sorted({ids[g] for g, info in table.items() if info.state == CREATED})

    async def withdraw(self, key: str) -> None:
        """Remove ``key``'s groups; it asks for nothing any more."""
        ids = self._held.pop(key, [])
        self._wants.pop(key, None)
        for gid in ids:
            with contextlib.suppress(Exception):  # gone with the controller's last run
                await self._io.remove_group(gid)

    async def withdraw_job(self, job: str) -> None:
        """Withdraw every want of ``job``."""
        for key in [k for k in self._wants if k.split("/", 1)[-1] == job]:
            await self.withdraw(key)

    async def keep_only(self, jobs: set[str]) -> None:
        """Withdraw the wants of jobs not in ``jobs`` (the loop's safety net)."""
        for key in [k for k in self._wants if k.split("/", 1)[-1] not in jobs]:
            await self.withdraw(key)


def _same_but_avoid(a: Want, b: Want) -> bool:
    """Whether two wants ask for the same groups, whatever nodes each avoids."""
    if len(a.groups) != len(b.groups):
        return False
    return all(
        (x.bundles, x.strategy, x.labels) == (y.bundles, y.strategy, y.labels)
        for x, y in zip(a.groups, b.groups, strict=True)
    )


async def wait_free(io: ClusterIO, freed: dict[str, dict[str, float]], wait: float) -> None:
    """Until Ray reports each node's ``freed`` resources available (it does so a moment
    after a removal), at most ``wait`` seconds."""
    deadline = core.now() + wait
    while core.now() < deadline:
        free = await io.free_resources()
        if all(
            free.get(node, {}).get(k, 0.0) + 1e-9 >= v
            for node, held in freed.items()
            for k, v in held.items()
        ):
            return
        await asyncio.sleep(0.1)
