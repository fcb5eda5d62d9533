"""Helpers for running the controller on the in-memory fake cluster (no Ray)."""

from __future__ import annotations

import asyncio
import hashlib

import msgspec

from clients.testing import virtual_time
from clients.testing.fake_cluster import FakeCluster
from clients.testing.legacy import v1_table
from controller.runtime.controller import PlacementController
from controller.runtime.core.settings import FAST, Settings
from controller.runtime.edge import REMOVED
from controller.state.assignments import Assignment
from controller.state.published import ReservationInfo
from controller.state.records import ReservationRecord
from controller.state.table import EVENT, RECORD, key


def cluster(gpu_nodes: int = 3, gpus: int = 4, **node) -> FakeCluster:
    """A head without GPUs and ``gpu_nodes`` nodes of ``gpus`` GPUs."""
    fake = FakeCluster()
    fake.add_node(num_gpus=0, num_cpus=2, head=True)
    for _ in range(gpu_nodes):
        fake.add_node(num_gpus=gpus, num_cpus=gpus, **node)
    return fake


def spec(placement: str = "0-3", num_nodes: int = 3, **more) -> dict:
    return {"num_nodes": num_nodes, "component_placement": {"actor": placement, **more}}


def run(coro):
    """Run ``coro`` on a virtual-time loop: the controller's waits pass at once."""
    return virtual_time.run(coro)


async def until(predicate, timeout: float = 5.0, interval: float = 0.005):
    """Poll ``predicate`` (plain or async) until it returns something truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def stored(fake: FakeCluster, job: str) -> ReservationRecord | None:
    """A job's record as the GCS holds it: what drivers see, not the controller's memory."""
    data = fake.kv.get(key(RECORD, job))
    return None if data is None else msgspec.msgpack.decode(data, type=ReservationRecord)


class _Blocks:
    """The stored assignments of a job, component by component."""

    def __init__(self, components: dict[str, list[Assignment]], uid: str, epoch: int):
        self.components, self.uid, self.epoch = components, uid, epoch


def published(fake: FakeCluster, job: str) -> _Blocks | None:
    """A job's stored assignments, expanded as a driver expands them."""
    from controller.state.published import ComponentBlock
    from controller.state.table import component_key

    record = stored(fake, job)
    if record is None:
        return None
    blocks = {}
    for c in record.world_sizes:
        data = fake.kv.get(component_key(job, c))
        if data is None:
            return None
        blocks[c] = msgspec.msgpack.decode(data, type=ComponentBlock)
    first = next(iter(blocks.values()))
    return _Blocks({c: b.assignments() for c, b in blocks.items()}, first.uid, first.epoch)


def table(fake: FakeCluster) -> dict[bytes, bytes]:
    """The reservation table as stored, without the event history (written a moment
    after each change, so a snapshot may or may not hold the newest events)."""
    return {k: v for k, v in fake.kv.items() if not k.startswith(EVENT)}


def live_groups(fake: FakeCluster) -> set[str]:
    return {g.gid for g in fake.groups_by_id.values() if g.state != REMOVED}


def table_groups(fake: FakeCluster) -> set[str]:
    """Group ids every stored record references."""
    out = set()
    for k, v in fake.kv.items():
        if k.startswith(RECORD):
            out |= msgspec.msgpack.decode(v, type=ReservationRecord).group_ids()
    return out


def info(data: bytes) -> ReservationInfo:
    return msgspec.msgpack.decode(data, type=ReservationInfo)


def assignments(data: bytes) -> list[Assignment]:
    return msgspec.msgpack.decode(data, type=list[Assignment])


async def controller(fake: FakeCluster, settings: Settings = FAST) -> PlacementController:
    ctl = PlacementController(io=fake, settings=settings)

    async def recovered() -> bool:
        return (await ctl.health())["recovered"]

    await until(recovered)
    return ctl


def write_v1(fake: FakeCluster, records: dict[str, ReservationRecord]) -> None:
    """Replace the fake GCS's table with the format-1 table of ``records``."""
    from controller.runtime.core.nodes import live_view
    from controller.state.table import LEGACY_KEY

    view = live_view([n.info for n in fake.nodes_by_id.values()], fake.accelerator)
    data = v1_table(records, view)
    fake.kv.clear()
    fake.kv[LEGACY_KEY] = data


def sha256(token: str) -> str:
    """The first 8 hex digits of the token's SHA-256: how the history names a client
    (docs/operations/events.md), computed here with hashlib, not with placectl."""
    return hashlib.sha256(token.encode()).hexdigest()[:8]
