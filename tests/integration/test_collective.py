"""The guarded group on a real local cluster: eight ranks on two nodes form it; every
process of the second node stops (a hung host: its ranks' connections stay open, Ray
calls them alive) while the first node's ranks wait in an all-reduce. Their call ends
with ``PeerLost`` naming ranks 4-7 within a second of the controller's verdict (its
``suspected`` event), not at gloo's 30 minutes; ``repair()`` relaunches the four
elsewhere, and the survivors, the same processes, form the next generation with them:
the all-reduce gives the sum over all eight again. gloo's own answer is what counts,
never placectl's record of itself."""

from __future__ import annotations

import os
import time

import pytest
import ray

import clients
from clients.testing import machines
from tests.integration.conftest import local_cluster

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cluster():
    """Head (no GPUs) + three nodes of 4 fake GPUs: two to reserve, one free."""
    yield from local_cluster(gpu_nodes=3)


class Rank:
    def __init__(self) -> None:
        self.group = None

    def form(self, again: bool = False) -> str:
        from clients.collective import GuardedGroup

        self.group = self.group.reform(120) if again else GuardedGroup.form(120)
        return self.group.generation

    def reduce(self) -> dict:
        import torch

        from clients.collective import PeerLost

        t = torch.ones(2) * (int(os.environ["RANK"]) + 1)
        try:
            self.group.all_reduce(t)
        except PeerLost as e:
            return {"lost": e.ranks, "at": time.time(), "why": str(e), "pid": os.getpid()}
        return {
            "sum": t[0].item(),
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
        }


def test_a_hung_hosts_peers_end_the_survivors_all_reduce_at_the_verdict_and_reform(cluster, ctl):
    res = ctl.reserve("guarded", {"num_nodes": 3, "component_placement": {"actor": "0-7"}},
                      timeout_s=120)  # fmt: skip
    group = clients.WorkerGroup.launch(res, "actor", Rank)
    assert len(set(group.execute("form"))) == 1  # one generation for all eight
    assert {r["sum"] for r in group.execute("reduce")} == {36.0}
    before = group.execute("reduce")
    victim = before[4]["node"]
    assert {before[r]["node"] for r in range(4, 8)} == {victim} != {before[0]["node"]}
    node = next(n for n in cluster.list_all_nodes() if n.node_id == victim)
    procs = machines.hang(node)
    try:
        waiting = [group.actors[r].reduce.remote() for r in range(4)]
        ended = ray.get(waiting, timeout=60)  # gloo alone would wait 30 minutes
        told = [e for e in ctl.events() if e.kind == "suspected" and victim[:12] in e.message]
        assert len(told) == 1, (told, ended)
        for r, got in enumerate(ended):
            assert sorted(got.get("lost", {})) == [4, 5, 6, 7], (r, got)
            assert got["pid"] == before[r]["pid"]
            # Within a second of the verdict (the event's clock is the controller's).
            assert got["at"] - told[0].at < 1.0, (got["at"] - told[0].at, got["why"])
        assert group.repair(timeout=60) == [4, 5, 6, 7]
        # The survivors reform, the replacements form: the next generation, all eight.
        refs = [a.form.remote(again=r < 4) for r, a in enumerate(group.actors)]
        assert len(set(ray.get(refs, timeout=120))) == 1
        after = group.execute("reduce")
        assert {r["sum"] for r in after} == {36.0}
        assert [after[r]["pid"] for r in range(4)] == [before[r]["pid"] for r in range(4)]
        assert victim not in {after[r]["node"] for r in range(4, 8)}
    finally:
        machines.resume(node, procs)
    group.shutdown()
