"""The fake cluster's nodes and groups, and where it places a group: as Ray does where
placectl depends on it (:mod:`clients.testing.fake_cluster`)."""

from __future__ import annotations

import asyncio

from controller.runtime.edge import PENDING, NodeInfo


class FakeFault(RuntimeError):
    """An injected failure."""


class FakeNode:
    def __init__(self, info: NodeInfo, accelerator: str, device_ids: list[int]):
        self.info = info
        self.free = dict(info.resources)
        self.devices = list(device_ids)  # physical ids, in Ray's slot order
        self.used_devices: set[int] = set()
        self.bound_ports: set[int] = set()
        self.ephemeral = (32768, 60999)
        self.answers = True
        self.raylet = "ok"  # what its raylet answers a health check: ok, refused, silent
        self.left: dict[str, str] = {}  # processes workers left: command -> their tag
        self.swept: list[tuple[str, bool]] = []  # sweeps run here: (uid, Ray workers too)

    def unbound(self, candidates: list[int]) -> list[int]:
        """The ports of ``candidates`` nothing here has bound, outside the ephemeral range."""
        low, high = self.ephemeral
        return [p for p in candidates if p not in self.bound_ports and not low <= p <= high]

    def end_left(self, uid: str, ray_workers: bool = False) -> list[str]:
        """End the processes workers of reservation ``uid`` left here (its Ray workers
        too, with ``ray_workers``); their commands."""
        self.swept.append((uid, ray_workers))
        ended = [
            c
            for c, tag in self.left.items()
            if tag.startswith(f"{uid}:") and (ray_workers or not c.startswith("ray::"))
        ]
        for command in ended:
            del self.left[command]
        return ended


class FakeGroup:
    def __init__(
        self, gid: str, name: str, bundles: list[dict[str, float]], node_id: str, demand=None
    ):
        self.gid, self.name, self.bundles, self.node_id = gid, name, bundles, node_id
        self.demand = demand  # a DemandGroup: placed on any node its selector allows
        self.state = PENDING
        self.devices: list[int | None] = [None] * len(bundles)
        self.on: list[str] = [node_id] * len(bundles)  # each bundle's node once placed
        # Aimed at its node by a hint, not pinned (Ray 2.48): placed elsewhere if its node
        # has no room, and moved by Ray to another node when its node dies.
        self.soft = False
        self.ready = asyncio.Event()


def fits(free: dict[str, float], bundles: list[dict[str, float]]) -> bool:
    """Whether ``bundles`` together fit in ``free``."""
    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in need.items())


def usable(node: FakeNode, g: FakeGroup, draining) -> bool:
    """Whether ``g`` may be placed on ``node`` at all: a pinned group on its node only;
    demand where its selector allows. Nothing new lands on a draining node."""
    if not node.info.alive or node.info.node_id in draining:
        return False
    d = g.demand
    if d is None:
        return g.soft or node.info.node_id == g.node_id
    labels = node.info.labels
    return node.info.node_id not in d.avoid and all(labels.get(k) == v for k, v in d.labels.items())


def place(g: FakeGroup, nodes: list[FakeNode]) -> list[str] | None:
    """Each bundle's node among ``nodes`` (those ``usable`` for it), if ``g`` can be
    placed now: a pinned group on its node; demand all on one node (STRICT_PACK), one
    bundle per node (STRICT_SPREAD) or on as few nodes as it fits (PACK)."""
    strategy = "STRICT_PACK" if g.demand is None else g.demand.strategy
    whole = [n for n in nodes if fits(n.free, g.bundles)]
    whole.sort(key=lambda n: n.info.node_id != g.node_id)  # a hinted group: its node first
    if strategy == "STRICT_PACK" or (strategy == "PACK" and whole):
        return [whole[0].info.node_id] * len(g.bundles) if whole else None
    free = {n.info.node_id: dict(n.free) for n in nodes}
    out: list[str] = []
    for b in g.bundles:
        ok = [i for i, f in free.items() if fits(f, [b])]
        if strategy == "STRICT_SPREAD":
            ok = [i for i in ok if i not in out]
        if not ok:
            return None
        out.append(ok[0])
        for k, v in b.items():
            free[ok[0]][k] -= v
    return out
