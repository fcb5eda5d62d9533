"""The headline figures the README and the docs state, guarded: each measured as its
benchmark measures it, on a real local cluster, with a bound that a healthy run meets on
2 loaded cores and a regression of several times does not. (The benchmarks under
scripts/bench measure them properly, beside their baselines; this only notices when one
gets much worse.) Where else a figure is guarded: repair after a GCS restart in
test_head.py, the next step after a node loss in test_train.py, repair on a secured
cluster in test_secured.py."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
import ray

import clients
from clients.testing import machines
from tests.integration.conftest import local_cluster

SPEC = {"num_nodes": 3, "component_placement": {"actor": "0-7"}}
# docs/evidence/benchmarks.md: reserve and probe 4 nodes x 8 GPUs in 1.67 s (here
# 2 x 4); attach from a new driver, 64 assignments, in 41 ms; an abruptly dead node
# dead in Ray's table after placectl's fence in about 1.5 s (0.3 s measured with
# bench_secured.py; Ray alone 16 s and more); repair() back in 3.4-4.1 s.
RESERVE_S = 8.0
ATTACH_S = 0.5
DEAD_S = 5.0
REPAIR_S = 10.0


@pytest.fixture(scope="module")
def cluster():
    """Head (no GPUs) + three nodes of 4 fake GPUs: two to reserve, one spare."""
    yield from local_cluster(gpu_nodes=3)


class Worker:
    def ping(self) -> int:
        return 1


def test_reserve_and_attach_stay_near_their_figures(cluster):
    ctl = clients.connect()
    took = []
    for i in range(3):
        started = time.monotonic()
        ctl.reserve(f"fig{i}", SPEC, timeout_s=120)
        took.append(time.monotonic() - started)
        ctl.release(f"fig{i}")
    assert statistics.median(took) < RESERVE_S, took
    ctl.reserve("attach", SPEC, timeout_s=120)
    attach = []
    for _ in range(5):
        started = time.monotonic()
        assert len(clients.Controller().reservation("attach").assignments("actor")) == 8
        attach.append(time.monotonic() - started)
    assert statistics.median(attach) < ATTACH_S, attach
    ctl.release("attach")


def test_an_abrupt_death_is_dead_in_ray_and_repaired_near_its_figures(cluster):
    ctl = clients.connect()
    res = ctl.reserve("abrupt", SPEC, timeout_s=120)
    group = clients.WorkerGroup.launch(res, "actor", Worker)
    group.execute("ping")
    lost = res.assignments("actor")[0].placement.node_id
    seen: list[float] = []

    def until_dead() -> None:  # Ray's own table, not placectl's record
        while any(n["NodeID"] == lost and n["Alive"] for n in ray.nodes()):
            time.sleep(0.05)
        seen.append(time.monotonic())

    watch = threading.Thread(target=until_dead, daemon=True)
    started = time.monotonic()
    watch.start()
    machines.crash(cluster, next(n for n in cluster.list_all_nodes() if n.node_id == lost))
    group.repair(timeout=120)
    repaired = time.monotonic() - started
    watch.join(60)
    assert seen and seen[0] - started < DEAD_S, seen
    assert repaired < REPAIR_S, repaired
    assert group.execute("ping") == [1] * 8
    group.shutdown()
    ctl.release("abrupt")
