"""Running short on a real local cluster (``on_loss: continue``): a node lost abruptly
under a rollout-like group costs its ranks, not the job. ``repair()`` returns with them
once Ray's verdict is in, before any replacement runs; the other ranks keep serving; the
replacements start in the background on the node the reservation now puts the slots on,
and take work only once admitted and pushed the job's weights. Read from the processes
(their pids, Ray's runtime context in them, the versions they say they hold) and from
``placectl status``, never from placectl's own records."""

from __future__ import annotations

import os
import time

import pytest
import ray

import clients
import clients.weights
from clients.testing import machines
from tests.integration.conftest import local_cluster, placectl_cli, remove, wait_for

JOB = "short"
CONF = {
    "num_nodes": 3,  # head + two nodes of 4 GPUs; a third stays free for the repair
    "component_placement": {"rollout": {"placement": "0,1,4,5", "on_loss": "continue"}},
}
LOAD_S = 3.0  # each replacement's start: long enough to see the group go on without it


@pytest.fixture(scope="module")
def cluster():
    """Head (no GPUs) + three nodes of 4 fake GPUs: the job's two and a free one."""
    yield from local_cluster(gpu_nodes=3)


class Engine:
    def __init__(self) -> None:
        time.sleep(LOAD_S)

    def load(self, version: int) -> int:
        clients.weights.hold(version)
        return version

    def load_torn(self, version: int, dies: int) -> int:
        """A load that dies half-way on rank ``dies`` (its weights partly overwritten)."""
        if int(os.environ["RANK"]) == dies:
            raise RuntimeError("the broadcast's peer was lost half-way")
        return self.load(version)

    def load_slow(self, version: int, seconds: float) -> int:
        time.sleep(seconds if os.environ["RANK"] == "0" else 0)
        return self.load(version)

    def generate(self, prompts: list[int], version: int) -> list[int]:
        clients.weights.require(version)
        return [p * 10 for p in prompts]

    def seen(self) -> dict:
        ctx = ray.get_runtime_context()
        return {"pid": os.getpid(), "node": ctx.get_node_id(), "rank": os.environ["RANK"]}


def test_a_torn_load_serves_nothing_and_a_stuck_push_says_which_ranks(cluster):
    """The weights guard over real pushes: a load that dies half-way on one rank leaves
    it holding no version (it refuses the old version's work too, and serving() leaves
    it out), and a push whose load does not finish within its timeout raises naming
    the rank, rather than wait on."""
    ctl = clients.connect()
    try:
        res = ctl.reserve(f"{JOB}-push", CONF, timeout_s=120)
        group = clients.WorkerGroup.launch(res, "rollout", Engine)
        group.push("load", 1, version=1)
        with pytest.raises(ray.exceptions.RayTaskError, match="lost half-way"):
            group.push("load_torn", 2, 1, version=2)
        assert group.versions() == {0: 2, 1: None, 2: 2, 3: 2}
        assert sorted(group.serving(1)) == []  # none serves the old version any more
        with pytest.raises(ray.exceptions.RayTaskError, match="a load of version 2 began"):
            ray.get(group.live[1].generate.remote([0], 1))
        started = time.monotonic()
        with pytest.raises(clients.PushTimeout, match=r"ranks \[0\] did not finish load_slow"):
            group.push("load_slow", 3, 30.0, version=3, timeout=3)
        assert time.monotonic() - started < 15
        group.shutdown()
    finally:
        ctl.release_all()


def test_a_hung_node_Ray_calls_alive_costs_its_ranks_at_once(cluster):
    """Case 1 of the faults in combination: every process of a rollout node stopped (a
    hung kernel; a host cut off reads the same). Ray calls the node and its actors alive
    for a minute; placectl suspects it in seconds and moves its slot. Its ranks are lost
    to running short on that verdict, not on Ray's: repair() returns them, the group
    goes on without them, and their replacements start where the slot went and are
    admitted. Resumed, the node is swept and free again (for the test below)."""
    ctl = clients.connect()
    try:
        res = ctl.reserve(JOB, CONF, timeout_s=120)
        group = clients.WorkerGroup.launch(res, "rollout", Engine, detached=True)
        group.push("load", 1, version=1)
        before = {r: ray.get(a.seen.remote()) for r, a in group.live.items()}
        victim = before[3]["node"]
        node = next(n for n in cluster.list_all_nodes() if n.node_id == victim)
        procs = machines.hang(node)
        try:
            started = time.monotonic()
            lost = group.repair(timeout=60, hung_after=5)
            took = time.monotonic() - started
            assert lost == [2, 3], f"after {took:.1f}s"
            assert took < 20, took
            alive = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
            assert alive[victim]  # Ray still calls it alive: the verdict was placectl's
            assert group.short == [2, 3] and sorted(group.live) == [0, 1]
            group.push("load", 2, version=2)  # the survivors alone: no wait on the hung
            assert sorted(group.serving(2)) == [0, 1]
            ready = wait_for(lambda: group.replacements_ready() == [2, 3] and [2, 3], 60)
            assert group.admit(ready) == [2, 3]
            fresh = res.assignments("rollout")
            for r in (2, 3):
                seen = ray.get(group.live[r].seen.remote())
                assert seen["node"] == fresh[r].placement.node_id != victim
            group.push("load", 3, version=3)
            assert sorted(group.serving(3)) == [0, 1, 2, 3]
        finally:
            machines.resume(node, procs)
        assert machines.wait_gone([before[r]["pid"] for r in (2, 3)], timeout=60) == []
        wait_for(lambda: victim not in ctl.health()["doubts"], timeout=60)
        group.shutdown()
    finally:
        ctl.release_all()


def test_a_lost_node_costs_its_ranks_and_the_group_goes_on_until_it_admits_them(cluster):
    ctl = clients.connect()
    try:
        res = ctl.reserve(JOB, CONF, timeout_s=120)
        group = clients.WorkerGroup.launch(res, "rollout", Engine, detached=True)
        group.push("load", 1, version=1)
        assert sorted(group.serving(1)) == [0, 1, 2, 3]
        before = {r: ray.get(a.seen.remote()) for r, a in group.live.items()}
        lost_node = before[3]["node"]
        assert before[2]["node"] == lost_node != before[0]["node"]

        remove(cluster, lost_node)  # abruptly: every process of the node killed
        started = time.monotonic()
        lost = group.repair(timeout=120, hung_after=5)
        took = time.monotonic() - started
        assert lost == [2, 3]
        assert group.short == [2, 3]
        # repair() did not wait for a replacement's start (each takes LOAD_S)
        assert not group.replacements_ready(), f"repair() took {took:.1f}s"
        # the survivors serve on, the same processes
        serving = group.serving(1)
        assert sorted(serving) == [0, 1]
        assert all(ray.get(serving[r].seen.remote())["pid"] == before[r]["pid"] for r in (0, 1))
        assert ray.get([a.generate.remote([r], 1) for r, a in serving.items()]) == [[0], [10]]
        with pytest.raises(clients.PlacementError, match="runs short"):
            group.execute_async("generate", [0], 1)

        # placectl status says so, from another process
        said = placectl_cli(cluster.address, "status", JOB)
        assert said.returncode == 0, said.stderr
        assert "rollout: running short, ranks [2, 3]" in said.stdout

        ready = wait_for(lambda: group.replacements_ready() == [2, 3] and [2, 3], timeout=120)
        assert group.admit(ready) == [2, 3]
        assert group.short == []
        fresh = res.assignments("rollout")
        now = {r: ray.get(a.seen.remote()) for r, a in group.live.items()}
        for r in (2, 3):  # where Ray runs them is where the reservation put the slots
            assert now[r]["node"] == fresh[r].placement.node_id != lost_node
            assert now[r]["rank"] == str(r)
        # admitted, but holding no weights of the job: no work until the push
        assert group.versions() == {0: 1, 1: 1, 2: None, 3: None}
        assert sorted(group.serving(1)) == [0, 1]
        with pytest.raises(clients.StaleWeights, match="rank 2: None, rank 3: None"):
            group.execute_async("generate", [0], 1, version=1)
        with pytest.raises(ray.exceptions.RayTaskError, match="holds the weights of version"):
            ray.get(group.live[2].generate.remote([0], 1))  # the rank refuses by itself

        group.push("load", 2, version=2)
        assert sorted(group.serving(2)) == [0, 1, 2, 3]
        assert ray.get(group.execute_async("generate", [4], 2, version=2)) == [[40]] * 4
        said = placectl_cli(cluster.address, "status", JOB)
        assert "running short" not in said.stdout
        group.shutdown()
    finally:
        ctl.release_all()
