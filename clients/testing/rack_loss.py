"""A rack lost under many jobs, on the in-memory fake cluster with Ray's own latencies: how
long until every job on it is repaired, beside one job's repair alone.

The cluster has ``nodes`` GPU nodes of 8 GPUs in racks of 8 (label ``placectl.io/rack``)
and a head. Each of ``jobs`` jobs holds 2 GPUs of one node of the first rack (4 jobs a
node); the other racks are free. The whole first rack dies at once (Ray's node events),
and the loop repairs every job on its own: each repair chooses a spare, makes its group
and probes it. Those take what they take on a real cluster (``latency``: the GCS
schedules one group at a time, then the group is placed; a probe task in a bundle, one at
a time per node), spent for real by the fake (``FakeCluster(sleeps=True)``); everything
else of the fake answers at once, so the time measured is the controller's and the
modelled Ray's. What ``scripts/bench/bench_rack_loss.py`` measures
(on the real clock) and ``tests/unit/test_rack_loss.py`` bounds (on the virtual clock,
where the sleeps pass in order and at once).
"""

from __future__ import annotations

import asyncio

import msgspec

from clients.testing.fake_cluster import FakeCluster, Latency
from controller.runtime.controller import PlacementController
from controller.runtime.core.settings import Settings
from controller.state.records import ReservationRecord
from controller.state.table import RECORD, key

RACK_LABEL = "placectl.io/rack"
GPUS, RACK, PER_NODE = 8, 8, 4  # GPUs a node, nodes a rack, jobs a node of the first rack
# Measured on a local cluster of this machine (scripts/bench/bench_rack_loss.py --real,
# 2026-11-28): a pinned group made and placed alone 5.7 ms (the GCS schedules one at a
# time: modelled as all of it serial), a warm probe 12 ms, and Ray's node table calling a
# node dead 0.67 s after its processes were killed.
RAY = Latency(gcs_rtt=0.002, per_node_read=0.00002, group_create=0.0057, group_place=0.0,
              probe=0.012, notice=0.67)  # fmt: skip
SETTINGS = Settings(reconcile_period=0.01, warm_budget=0, liveness_period=0.5)


def _record(fake: FakeCluster, job: str) -> ReservationRecord | None:
    data = fake.kv.get(key(RECORD, job))
    return None if data is None else msgspec.msgpack.decode(data, type=ReservationRecord)


def _spec(job: int, cluster_nodes: int) -> dict:
    node_rank = 1 + job // PER_NODE  # the head is rank 0; the first rack follows
    first = (job % PER_NODE) * (GPUS // PER_NODE)
    return {
        "num_nodes": cluster_nodes,
        "node_groups": [{"label": "mine", "node_ranks": str(node_rank)}],
        "component_placement": {
            "actor": {"node_group": "mine", "placement": f"{first}-{first + 1}"}
        },
    }


async def rack_loss(jobs: int = 32, nodes: int = 1000, latency: Latency = RAY) -> dict:
    """Reserve ``jobs`` jobs on the first rack, kill the rack, wait until every job is
    repaired. Returns ``{"seconds": ..., "jobs": ..., "claims": ...}`` (seconds on the
    running loop's clock)."""
    if not 1 <= jobs <= RACK * PER_NODE:
        raise ValueError(f"jobs={jobs}: the first rack holds 1 to {RACK * PER_NODE}")
    fake = FakeCluster(latency=latency)
    fake.add_node(num_cpus=8, head=True)
    for i in range(nodes):
        fake.add_node(num_gpus=GPUS, num_cpus=2 * GPUS, labels={RACK_LABEL: f"r{i // RACK:04d}"})
    ctl = PlacementController(io=fake, settings=SETTINGS)
    try:
        while not (await ctl.health())["recovered"]:
            await asyncio.sleep(0.001)
        names = [f"job{j:03d}" for j in range(jobs)]
        await asyncio.gather(*(ctl.reserve(n, _spec(j, nodes + 1)) for j, n in enumerate(names)))
        held = {s.node_id for n in names for s in _record(fake, n).slots}
        racks = {fake.nodes_by_id[n].info.labels.get(RACK_LABEL) for n in held}
        rack = sorted(  # the whole rack the jobs are on, not only their nodes
            n for n, node in fake.nodes_by_id.items() if node.info.labels.get(RACK_LABEL) in racks
        )
        fake.sleeps = True  # from here on, Ray's costs are spent
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.sleep(latency.notice)  # the rack is dead; Ray says so this late
        for node in rack:
            fake.kill_node(node)
        while True:
            done = [n for n in names if (r := _record(fake, n)).epoch == 2 and r.state == "ready"]
            if len(done) == len(names):
                break
            await asyncio.sleep(0.005)
        took = loop.time() - started
        moved = {s.node_id for n in names for s in _record(fake, n).slots}
        if moved & set(rack):
            raise RuntimeError("a job was repaired onto a dead node")
        return {"seconds": took, "jobs": jobs, "claims": ctl.ops.ctx.claims.made}
    finally:
        await ctl.stop()


__all__ = ["rack_loss"]
